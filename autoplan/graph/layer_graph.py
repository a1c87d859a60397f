"""LayerGraph: the traced model as a chain of layers, with what the cost models need of each.

All per-layer figures are for ONE sample (batch 1) at the traced sequence length; FLOPs, bytes
moved and activations scale linearly with the micro-batch size. Quantities are split into the
part tensor parallelism shards (``*_sharded``: inside a column->row Linear pair, or the
vocab-parallel embedding/head) and the part it replicates (``*_replicated``: the residual stream,
norms, dropouts on it), which sequence parallelism shards too (Korthikanti et al. 2022, Table 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class LayerKind(str, Enum):
    EMBEDDING = "embedding"
    BLOCK = "block"
    NORM = "norm"
    HEAD = "head"
    LOSS = "loss"
    MODULE = "module"


class TpSplit(str, Enum):
    COLUMN = "column"  # output features split: QKV, MLP up/gate, vocab-parallel head
    ROW = "row"  # input features split, followed by an all-reduce: attention out, MLP down
    VOCAB = "vocab"  # vocab-parallel embedding (all-reduce of its output)
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Gemm:
    """One Linear of a layer: ``rows x in_features @ in_features x out_features`` per sample."""

    name: str
    in_features: int
    out_features: int
    split: TpSplit
    count: int = 1  # how many times the layer applies it
    rows: int = 1  # rows of its input per sample (tokens for a transformer)
    wgrad: bool = True  # its weight requires grad: backward runs the weight-gradient GEMM
    dgrad: bool = True  # its input requires grad: backward runs the input-gradient GEMM
    adapter: bool = False  # a low-rank adapter (LoRA A or B) beside a frozen base Linear

    @property
    def weight_params(self) -> int:
        """Elements of its weight matrix (one copy, however often it is applied)."""
        return self.in_features * self.out_features

    @property
    def fwd_flops(self) -> float:
        """Forward FLOPs per sample (2 per multiply-add, as FlopCounterMode counts)."""
        return 2.0 * self.rows * self.in_features * self.out_features * self.count


@dataclass(frozen=True, slots=True)
class Attention:
    """A scaled-dot-product attention call, recorded as attention rather than its matmuls."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    seq_len: int
    causal: bool
    dropout: float
    fwd_flops: float  # per sample, as FlopCounterMode counts the fused kernel
    bwd_flops: float
    backward: bool = True  # q, k or v requires grad (False inside a frozen prefix)


@dataclass(frozen=True, slots=True)
class Experts:
    """A mixture-of-experts layer, recorded for expert parallelism. Its expert matmuls are also
    in the layer's ``gemms`` as one expert over all routed rows (balanced routing: the same
    FLOPs as ``num_experts`` experts of ``tokens_per_expert`` rows); the router is a Gemm with
    split NONE."""

    name: str  # the module holding the experts
    num_experts: int
    top_k: int  # experts each token is routed to
    params_per_expert: int
    tokens_per_expert: float  # per sample, balanced routing: tokens * top_k / num_experts
    router: str  # the router's name (its Gemm)


@dataclass(frozen=True, slots=True)
class OpSacBytes:
    """Op outputs selective op checkpointing saves per sample: ``sharded`` lie in TP-sharded
    regions (column-parallel Linear and attention outputs, 1/tp each on a TP rank);
    ``partial`` are row-parallel Linear outputs, whole on every TP rank (partial sums)."""

    sharded: float
    partial: float


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer of the chain (a block, the embedding, the head...). Per sample, see module doc."""

    name: str
    kind: LayerKind
    num_params: int
    params_sharded: int  # parameters TP splits (Linear weights in pairs, vocab tables)
    param_bytes: int  # as built by model.py (dtype of its parameters)
    fwd_flops: float
    bwd_flops: float
    activation_bytes_sharded: float  # saved for backward, split by TP
    activation_bytes_replicated: float  # saved for backward, split only by SP
    attention_internal_bytes: float  # saved inside attention kernels (selective recompute drops)
    elementwise_bytes_sharded: float  # memory traffic of non-matmul ops, forward
    elementwise_bytes_replicated: float
    boundary_bytes: float  # the output tensor: what a pipeline cut after this layer sends
    input_bytes: float  # the input tensor: what full recompute keeps
    gemms: tuple[Gemm, ...] = ()
    attention: tuple[Attention, ...] = ()
    tp_allreduces: int = 0  # forward all-reduces (one per row-parallel Linear / vocab embedding)
    tied_params: int = 0  # parameters shared with an earlier layer (counted there)
    modules: tuple[str, ...] = ()  # module names the layer consists of (for device maps)
    experts: tuple[Experts, ...] = ()  # MoE layers inside (empty for dense layers)
    param_modules: int = 0  # submodules owning parameters (ZeRO-3 per-module gathers)
    largest_module_params: int = 0  # parameters of the largest of them
    frozen_params: int = 0  # of num_params, those with requires_grad=False (no grad, no state)
    frozen_sharded: int = 0  # of params_sharded, the frozen ones
    in_backward: bool = True  # False before the first trainable parameter: no backward at all
    op_sac_bytes: OpSacBytes | None = None
    """What torchtitan's op-level selective checkpointing saves of this block besides its
    input (None: not a block)."""
    column_input_bytes: float = 0.0
    """Inputs of the column-parallel Linears (each storage once): under sequence parallelism
    the tensors a TP rank all-gathers before them."""

    @property
    def other_fwd_flops(self) -> float:
        """FLOPs of the layer's convolutions and bare matmuls (neither Linear nor attention)."""
        known = sum(g.fwd_flops for g in self.gemms) + sum(a.fwd_flops for a in self.attention)
        return max(0.0, self.fwd_flops - known)

    @property
    def params_replicated(self) -> int:
        return self.num_params - self.params_sharded

    @property
    def trainable_params(self) -> int:
        return self.num_params - self.frozen_params

    @property
    def trainable_sharded(self) -> int:
        """Trainable parameters TP splits (adapters are split as their base Linear)."""
        return self.params_sharded - self.frozen_sharded

    @property
    def activation_bytes(self) -> float:
        return self.activation_bytes_sharded + self.activation_bytes_replicated


@dataclass(frozen=True, slots=True)
class ModelDims:
    """Shape facts exporters and TP constraints need (from the repeated block)."""

    hidden_size: int
    num_layers: int  # repeated blocks
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    gated_mlp: bool = False  # SwiGLU-style MLP (three Linears)
    rmsnorm: bool = False
    rotary: bool = False  # no learned position table
    tied_embeddings: bool = False
    linear_bias: bool = True
    rope_theta: float | None = None  # rotary base, when the model states it
    rope_scaling_type: str | None = None  # e.g. "llama3" (Hugging Face rope_scaling rope_type)
    rope_scaling_factor: float | None = None
    norm_eps: float | None = None  # epsilon of the block's norms


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """A PEFT LoRA model's adapters, as its ``peft_config`` and modules state them: rank,
    alpha, dropout and the names (last component) of the Linears that carry adapters."""

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LayerGraph:
    """The traced model: its layers in execution order and the traced sequence length."""

    name: str
    layers: tuple[Layer, ...]
    seq_len: int
    dims: ModelDims | None = None
    tp_divisors: tuple[int, ...] = field(default=())  # counts TP must divide (heads, KV heads)
    lora: LoraSpec | None = None  # a PEFT LoRA model's adapters
    _blocks: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _moe: bool = field(init=False, repr=False, compare=False)
    """Found once (the blocks' indices, whether any layer holds experts): the search asks for
    them thousands of times."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_blocks", tuple(
            i for i, layer in enumerate(self.layers) if layer.kind is LayerKind.BLOCK))
        object.__setattr__(self, "_moe", any(layer.experts for layer in self.layers))

    def has_experts(self) -> bool:
        """Whether any layer is a mixture of experts."""
        return self._moe

    @property
    def num_params(self) -> int:
        return sum(layer.num_params for layer in self.layers)

    @property
    def num_trainable_params(self) -> int:
        return sum(layer.trainable_params for layer in self.layers)

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    @property
    def bwd_flops(self) -> float:
        return sum(layer.bwd_flops for layer in self.layers)

    def block_indices(self) -> list[int]:
        return list(self._blocks)
