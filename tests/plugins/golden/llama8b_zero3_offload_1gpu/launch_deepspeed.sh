#!/usr/bin/env bash
# DeepSpeed launch script.
#
# Planned by autoplan for llama3-8b on one A100.
# Plan: TP1 x PP1 x DP1, mbs 1, ZeRO-3, full recompute, offload params on 1 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 1 x 16 micro-batches x DP 1 = global batch 16 sequences of 4096 tokens, bf16.
# Predicted for DeepSpeed: 95.000 s/step, 690 tokens/s, MFU 21.0%, peak memory 71.0 GiB of 80.0 GiB per GPU.
# Solver: OPTIMAL, objective 1.000 s, gap 0.0%.
#
# The model code builds the engine: deepspeed.initialize(..., config=ds_config.json).
# .deepspeed_env (read through DS_ENV_FILE) exports to every rank: nothing needed here.
# Run once, on the first host; extra arguments go to TRAIN_SCRIPT.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script (it calls deepspeed.initialize)}"
export DS_ENV_FILE="$HERE"/.deepspeed_env
exec deepspeed --hostfile "$HERE"/hostfile --num_nodes 1 --num_gpus 1 \
  --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "${MASTER_PORT:-29500}" \
  "$TRAIN_SCRIPT" --deepspeed --deepspeed_config "$HERE"/ds_config.json "$@"
