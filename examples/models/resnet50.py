"""ResNet-50 (He et al. 2016) from transformers' ResNetConfig defaults (bottleneck blocks, depths
3-4-6-3), 224x224 images; --seq-len is ignored. transformers rather than torchvision, whose PyPI
wheels do not import beside the CPU torch."""

import torch
from transformers import ResNetConfig, ResNetForImageClassification


def build_model():
    return ResNetForImageClassification(ResNetConfig(num_labels=1000))


def example_inputs(batch_size, seq_len):
    return torch.zeros(batch_size, 3, 224, 224)
