#!/usr/bin/env bash
# PyTorch native stack (DeviceMesh, parallelize_module, pipelining, FSDP2) launched with torchrun.
#
# Planned by autoplan for gpt-13b on 2 nodes on 10GbE.
# Plan: TP1 x PP2 x DP8, mbs 1, ZeRO-1, full recompute on 16 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 1 x 16 micro-batches x DP 8 = global batch 128 sequences of 2048 tokens, bf16.
# Predicted for DeepSpeed: 41.000 s/step, 6,394 tokens/s, MFU 18.0%, peak memory 62.0 GiB of 80.0 GiB per GPU.
# Solver: FEASIBLE, objective 1.000 s, gap 10.0%.
#
# Run launch_torchrun.sh on every node with MODEL_PY set to your model.py; autoplan must be installed there.
# train.py trains on random tokens: replace batches() with your data.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${MODEL_PY:?set MODEL_PY to the model.py the plan was made for}"
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
done < "$HERE"/torchrun_args.txt
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  "$HERE"/train.py --model "$MODEL_PY" --plan "$HERE"/plan.json "${ARGS[@]}" "$@"
