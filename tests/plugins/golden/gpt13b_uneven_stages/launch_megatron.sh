#!/usr/bin/env bash
# Megatron-LM launch script (torchrun, one call per node).
#
# Planned by autoplan for gpt-13b on one DGX A100.
# Plan: TP2 x PP4 x DP1, mbs 2, ZeRO-0, full recompute, SP on 8 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 2 x 16 micro-batches x DP 1 = global batch 32 sequences of 2048 tokens, fp16.
# Predicted for Megatron-LM: 7.500 s/step, 8,738 tokens/s, MFU 45.0%, peak memory 70.2 GiB of 80.0 GiB per GPU.
# Solver: OPTIMAL, objective 1.000 s, gap 0.0%.
#
# Add data, tokenizer, optimizer, schedule and checkpoint arguments yourself; the tokenizer must give the planned vocabulary of 50304.
# Run launch_megatron.sh on every node with MEGATRON_LM set to a Megatron-LM checkout.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${MEGATRON_LM:?set MEGATRON_LM to the Megatron-LM checkout with pretrain_gpt.py}"
export CUDA_DEVICE_MAX_CONNECTIONS=1
NNODES=1
NPROC_PER_NODE=8
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
NODE_RANK="${NODE_RANK:-0}"
ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  ARGS+=("${words[@]}")
done < "$HERE"/megatron_args.txt
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  "$MEGATRON_LM"/pretrain_gpt.py "${ARGS[@]}" "$@"
