#!/usr/bin/env bash
# torchtitan launch script (torchrun, one call per node).
#
# Planned by autoplan for gpt-13b on 2 nodes on 10GbE.
# Plan: TP1 x PP2 x DP8, mbs 1, ZeRO-1, full recompute on 16 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 1 x 16 micro-batches x DP 8 = global batch 128 sequences of 2048 tokens, bf16.
# Predicted for DeepSpeed: 41.000 s/step, 6,394 tokens/s, MFU 18.0%, peak memory 62.0 GiB of 80.0 GiB per GPU.
# Solver: FEASIBLE, objective 1.000 s, gap 10.0%.
#
# Set TORCHTITAN_MODULE and TORCHTITAN_CONFIG to the model and config registry entry (e.g. llama3 llama3_8b); extra arguments go before the plan's, which win.
# Offload, if planned, is FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer state).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${TORCHTITAN_MODULE:?set TORCHTITAN_MODULE to a torchtitan model, e.g. llama3}"
: "${TORCHTITAN_CONFIG:?set TORCHTITAN_CONFIG to its config, e.g. llama3_8b}"
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=eth0
NNODES=2
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:-192.168.1.11}"
MASTER_PORT="${MASTER_PORT:-29500}"
if [[ -z "${NODE_RANK:-}" ]]; then
  case "$(hostname -s)" in
    node-01|192.168.1.11) NODE_RANK=0 ;;
    node-02|192.168.1.12) NODE_RANK=1 ;;
    *) echo "$(hostname -s) is not a host of the plan; set NODE_RANK" >&2; exit 1 ;;
  esac
fi
ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  ARGS+=("${words[@]}")
done < "$HERE"/torchtitan_args.txt
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  -m torchtitan.train --module "$TORCHTITAN_MODULE" --config "$TORCHTITAN_CONFIG" "$@" "${ARGS[@]}"
