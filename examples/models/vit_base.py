"""ViT-Base/16 (Dosovitskiy et al. 2021) from transformers' config defaults: 12 blocks, hidden
768, 12 heads, 224x224 images in 16x16 patches (197 tokens whatever --seq-len says). No
example_inputs: autoplan feeds pixel_values [b, 3, 224, 224] from the config."""

from transformers import ViTConfig, ViTForImageClassification


def build_model():
    return ViTForImageClassification(ViTConfig(num_labels=1000))
