#!/usr/bin/env bash
# torchtune launch script (tune run, one call per node).
#
# Planned by autoplan for llama3-8b on one A100.
# Plan: TP1 x PP1 x DP1, mbs 1, ZeRO-3, full recompute, offload params on 1 GPUs (rank order tp-cp-dp-pp, innermost first).
# Batch: micro-batch 1 x 16 micro-batches x DP 1 = global batch 16 sequences of 4096 tokens, bf16.
# Predicted for DeepSpeed: 95.000 s/step, 690 tokens/s, MFU 21.0%, peak memory 71.0 GiB of 80.0 GiB per GPU.
# Solver: OPTIMAL, objective 1.000 s, gap 0.0%.
#
# Recipe: full_finetune_distributed. Command: tune run --nnodes 1 --nproc_per_node 1 full_finetune_distributed --config CONFIG batch_size=1 gradient_accumulation_steps=16 dtype=bf16 enable_activation_checkpointing=True enable_activation_offloading=False compile=False optimizer._component_=torch.optim.AdamW optimizer_in_bwd=False fsdp_reshard_after_forward=True fsdp_cpu_offload=True tensor_parallel_dim=1
# CONFIG: a config of that recipe for your model (tune ls), e.g. llama2/7B_full; these overrides win over it. autoplan priced torch.compile off (compile=False) and activations kept on the GPU (enable_activation_offloading=False).
# torchtune trains in bf16 throughout (no fp32 master weights, optimizer state in bf16): it needs less memory than the mixed-precision state priced here.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${TORCHTUNE_CONFIG:?set TORCHTUNE_CONFIG to a config of full_finetune_distributed for your model (tune ls), e.g. llama2/7B_full}"
NNODES=1
NPROC_PER_NODE=1
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
NODE_RANK="${NODE_RANK:-0}"
ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  ARGS+=("${words[@]}")
done < "$HERE"/torchtune_overrides.txt
exec tune run --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" --node_rank "$NODE_RANK" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" full_finetune_distributed --config "$TORCHTUNE_CONFIG" "${ARGS[@]}" "$@"
