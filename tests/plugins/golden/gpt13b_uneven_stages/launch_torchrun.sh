#!/usr/bin/env bash
# PyTorch native stack (DeviceMesh, parallelize_module, pipelining, FSDP2) launched with torchrun.
#
# Planned by autoplan for gpt-13b on one DGX A100.
# Plan: TP2 x PP4 x DP1, mbs 2, ZeRO-0, full recompute, SP on 8 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 2 x 16 micro-batches x DP 1 = global batch 32 sequences of 2048 tokens, fp16.
# Predicted for Megatron-LM: 7.500 s/step, 8,738 tokens/s, MFU 45.0%, peak memory 70.2 GiB of 80.0 GiB per GPU.
# Solver: OPTIMAL, objective 1.000 s, gap 0.0%.
#
# Run launch_torchrun.sh on every node with MODEL_PY set to your model.py; autoplan must be installed there.
# train.py trains on random tokens: replace batches() with your data.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${MODEL_PY:?set MODEL_PY to the model.py the plan was made for}"
NNODES=1
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
NODE_RANK="${NODE_RANK:-0}"
ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  ARGS+=("${words[@]}")
done < "$HERE"/torchrun_args.txt
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  "$HERE"/train.py --model "$MODEL_PY" --plan "$HERE"/plan.json "${ARGS[@]}" "$@"
