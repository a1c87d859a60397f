#!/usr/bin/env bash
# DeepSpeed launch script.
#
# Planned by autoplan for gpt-13b on 2 nodes on 10GbE.
# Plan: TP1 x PP2 x DP8, mbs 1, ZeRO-1, full recompute on 16 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 1 x 16 micro-batches x DP 8 = global batch 128 sequences of 2048 tokens, bf16.
# Predicted for DeepSpeed: 41.000 s/step, 6,394 tokens/s, MFU 18.0%, peak memory 62.0 GiB of 80.0 GiB per GPU.
# Solver: FEASIBLE, objective 1.000 s, gap 10.0%.
#
# TRAIN_SCRIPT is Megatron-DeepSpeed's pretrain_gpt.py; it reads megatron_deepspeed_args.txt (Megatron TP, DeepSpeed pipeline engine with 2 stages).
# .deepspeed_env (read through DS_ENV_FILE) exports to every rank: NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=eth0.
# Run once, on the first host; extra arguments go to TRAIN_SCRIPT.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script (it calls deepspeed.initialize)}"
export DS_ENV_FILE="$HERE"/.deepspeed_env
ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  ARGS+=("${words[@]}")
done < "$HERE"/megatron_deepspeed_args.txt
exec deepspeed --hostfile "$HERE"/hostfile --num_nodes 2 --num_gpus 8 \
  --master_addr "${MASTER_ADDR:-192.168.1.11}" --master_port "${MASTER_PORT:-29500}" \
  "$TRAIN_SCRIPT" "${ARGS[@]}" --deepspeed --deepspeed_config "$HERE"/ds_config.json "$@"
