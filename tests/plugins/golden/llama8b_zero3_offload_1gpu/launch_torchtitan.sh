#!/usr/bin/env bash
# torchtitan launch script (torchrun, one call per node).
#
# Planned by autoplan for llama3-8b on one A100.
# Plan: TP1 x PP1 x DP1, mbs 1, ZeRO-3, full recompute, offload params on 1 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 1 x 16 micro-batches x DP 1 = global batch 16 sequences of 4096 tokens, bf16.
# Predicted for DeepSpeed: 95.000 s/step, 690 tokens/s, MFU 21.0%, peak memory 71.0 GiB of 80.0 GiB per GPU.
# Solver: OPTIMAL, objective 1.000 s, gap 0.0%.
#
# Set TORCHTITAN_MODULE and TORCHTITAN_CONFIG to the model and config registry entry (e.g. llama3 llama3_8b); extra arguments go before the plan's, which win.
# Offload, if planned, is FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer state).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${TORCHTITAN_MODULE:?set TORCHTITAN_MODULE to a torchtitan model, e.g. llama3}"
: "${TORCHTITAN_CONFIG:?set TORCHTITAN_CONFIG to its config, e.g. llama3_8b}"
NNODES=1
NPROC_PER_NODE=1
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
NODE_RANK="${NODE_RANK:-0}"
ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  ARGS+=("${words[@]}")
done < "$HERE"/torchtitan_args.txt
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
  --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  -m torchtitan.train --module "$TORCHTITAN_MODULE" --config "$TORCHTITAN_CONFIG" "$@" "${ARGS[@]}"
