torchrun --nproc_per_node 8 pretrain_gpt.py \
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 1 \
    --micro-batch-size 2 --global-batch-size 64 --seq-length 1024 \
    --use-distributed-optimizer --bf16
