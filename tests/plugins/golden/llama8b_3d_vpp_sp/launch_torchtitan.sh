#!/usr/bin/env bash
# torchtitan launch script (torchrun, one call per node).
#
# Planned by autoplan for llama3-8b on 4x DGX H100.
# Plan: TP4 x PP4 x DP2, VPP2, mbs 1, ZeRO-1, selective recompute, SP on 32 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 1 x 32 micro-batches x DP 2 = global batch 64 sequences of 4096 tokens, bf16.
# Predicted for Megatron-LM: 3.200 s/step, 81,920 tokens/s, MFU 52.0%, peak memory 61.5 GiB of 80.0 GiB per GPU.
# Solver: OPTIMAL, objective 1.000 s, gap 0.0%.
#
# Set TORCHTITAN_MODULE and TORCHTITAN_CONFIG to the model and config registry entry (e.g. llama3 llama3_8b); extra arguments go before the plan's, which win.
# Offload, if planned, is FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer state).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${TORCHTITAN_MODULE:?set TORCHTITAN_MODULE to a torchtitan model, e.g. llama3}"
: "${TORCHTITAN_CONFIG:?set TORCHTITAN_CONFIG to its config, e.g. llama3_8b}"
NNODES=4
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:-10.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
if [[ -z "${NODE_RANK:-}" ]]; then
  case "$(hostname -s)" in
    dgx-00|10.0.0.1) NODE_RANK=0 ;;
    dgx-01|10.0.0.2) NODE_RANK=1 ;;
    dgx-02|10.0.0.3) NODE_RANK=2 ;;
    dgx-03|10.0.0.4) NODE_RANK=3 ;;
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
