"""Build a plan with PyTorch's native stack and train it: the runtime behind ``autoplan verify``
and the ``train.py`` that ``autoplan export --to torchrun`` writes.

One rank's view of a plan:

* a ``DeviceMesh`` whose dimensions follow ``Plan.placement`` (innermost first, so the mesh is
  built outermost first: ``pp, dp, cp, tp`` for ``tp-cp-dp-pp``);
* pipeline stages cut where the plan cuts (:mod:`autoplan.verify.chain`), run by
  ``torch.distributed.pipelining`` (1F1B, or interleaved 1F1B when ``vpp > 1``);
* tensor parallelism with ``parallelize_module``: each Linear of a block gets ColwiseParallel or
  RowwiseParallel from the traced TP plan (``Layer.gemms``), norms get SequenceParallel under
  sequence parallelism. Column outputs stay DTensors (``use_local_output=False``) so that the
  model's own reshapes, written for the full head count, stay correct; DTensor inserts what the
  code needs (see :func:`autoplan.verify.tp_check.local_tp_problem` for code that would also run
  on local shards); vocabulary-sized embedding tables and the LM head are vocab-parallel as in
  Megatron (rows of the table, columns of the head; tied weights stay one sharded parameter),
  the logits gathered for model.py's loss;
* activation checkpointing of every block (full) or of everything but matmuls (selective);
* data parallelism: ZeRO-3 is FSDP2 ``fully_shard`` (parameters resharded after forward),
  ZeRO-1/2 ``fully_shard(reshard_after_forward=False)`` (gradients and optimizer state sharded,
  parameters gathered once per micro-batch), ZeRO-0 an all-reduce of gradients over the
  data-parallel group after the step (DDP's arithmetic);
* weights tied across pipeline stages (GPT's embedding and head) are kept in sync by summing
  their gradients between the stages that hold them (Megatron's embedding group).

Attention runs on PyTorch's math kernel: DTensor has no sharding rule for the CPU flash kernel,
and the single-process reference uses the same kernel so that losses compare exactly.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from autoplan.graph.layer_graph import LayerGraph, LayerKind, TpSplit
from autoplan.graph.loader import ModelSource
from autoplan.plan import Plan, Recompute
from autoplan.verify.chain import LOSS, Chain, StageModule

logger = logging.getLogger(__name__)

LEARNING_RATE = 1e-3
"""Adam learning rate of the verification runs (large enough that weights move visibly)."""


def math_attention():
    """Run scaled_dot_product_attention on the math kernel (see the module docstring)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.MATH)


def build_reference(source: ModelSource, *, seed: int) -> nn.Module:
    """The model as model.py builds it on CPU in fp32 with the given seed, dropout off.

    Dropout is switched off (eval mode) because no two shardings draw the same random masks;
    everything else trains as written.
    """
    torch.manual_seed(seed)
    model = source.build_model().float()
    return model.train(False)


def loss_of(source: ModelSource, output, inputs) -> torch.Tensor:
    """model.py's loss, or the trace's default (mean of the first output)."""
    from autoplan.graph.trace import model_loss
    return model_loss(source, output, inputs)


def mesh_dims(plan: Plan) -> list[tuple[str, int]]:
    """(axis name, size) of the device mesh, outermost first (placement reversed)."""
    sizes = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    return [(axis, sizes[axis]) for axis in reversed(plan.placement.split("-"))]


def tp_styles(graph: LayerGraph, chain: Chain, block: nn.Module, *, sequence_parallel: bool):
    """The ``parallelize_module`` plan of one block, from block 0's traced Linears."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel)
    prefix = chain.block_prefix()
    stream = Shard(1) if sequence_parallel else Replicate()
    styles = {}
    for gemm in graph.layers[chain.blocks[0]].gemms:
        name = gemm.name.removeprefix(prefix)
        if gemm.split is TpSplit.COLUMN:
            styles[name] = ColwiseParallel(input_layouts=stream, use_local_output=False)
        elif gemm.split is TpSplit.ROW:
            styles[name] = RowwiseParallel(output_layouts=stream)
    if sequence_parallel:
        for name, module in block.named_modules():
            if name and "norm" in type(module).__name__.lower():
                styles[name] = SequenceParallel()
    return styles


def _checkpointed(block: nn.Module, recompute: Recompute) -> nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    if recompute is Recompute.FULL:
        return checkpoint_wrapper(block, preserve_rng_state=False)
    from functools import partial

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    saved = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def policy(_ctx, op, *args, **kwargs):  # keep matmul outputs, recompute the rest
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE
    return checkpoint_wrapper(block, preserve_rng_state=False,
                              context_fn=partial(create_selective_checkpoint_contexts, policy))


@dataclass
class RankModel:
    """One rank's part of the plan: its stage modules, schedule, optimizer and groups."""

    plan: Plan
    source: ModelSource
    mesh: object
    stages: list[StageModule]
    schedule: object | None
    optimizer: torch.optim.Optimizer
    params: list[nn.Parameter]
    tied: list[tuple[object, list[nn.Parameter]]] = field(default_factory=list)

    @property
    def pp_rank(self) -> int:
        return self.mesh.get_local_rank("pp")

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp")

    def context(self):
        from torch.distributed.tensor.experimental import implicit_replication
        stack = contextlib.ExitStack()
        stack.enter_context(math_attention())
        stack.enter_context(implicit_replication())
        return stack

    def train_step(self, tokens: torch.Tensor) -> float | None:
        """One optimizer step on this data-parallel rank's ``[num_microbatches * mbs, seq]``
        token ids; the mean micro-batch loss where this rank holds the last stage, else None."""
        losses: list[torch.Tensor] = []
        with self.context():
            if self.schedule is None:
                self._accumulate(tokens, losses)
            else:
                self._pipeline_step(tokens, losses)
        self._sync_gradients()
        self.optimizer.step()
        # Gradient buffers stay allocated between steps, as Megatron's do (and as the memory
        # model counts them, all step long).
        self.optimizer.zero_grad(set_to_none=False)
        return float(torch.stack(losses).mean()) if losses else None

    def _accumulate(self, tokens, losses) -> None:
        stage = self.stages[0]
        for chunk in tokens.chunk(self.plan.num_microbatches):
            loss = loss_of(self.source, stage(chunk), chunk)
            (loss / self.plan.num_microbatches).backward()
            losses.append(loss.detach())

    def _pipeline_step(self, tokens, losses) -> None:
        first = self.pp_rank == 0
        last = self.pp_rank == self.plan.pp - 1
        args = (tokens,) if first else ()
        kwargs = {"target": tokens, "losses": losses} if last else {}
        self.schedule.step(*args, **kwargs)

    def _sync_gradients(self) -> None:
        from torch.distributed.tensor import DTensor
        local = lambda g: g._local_tensor if isinstance(g, DTensor) else g
        for group, params in self.tied:
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(local(p.grad), group=group)
        if self.plan.zero_stage == 0 and self.plan.dp > 1:
            group = self.mesh.get_group("dp")
            for p in self.params:
                if p.grad is not None:
                    grad = local(p.grad)
                    dist.all_reduce(grad, group=group)
                    grad.div_(self.plan.dp)


def _stage_indices(plan: Plan, pp_rank: int) -> list[int]:
    """Stages (pipeline order) a pipeline rank runs: chunk c is stage c * pp + rank."""
    return [c * plan.pp + pp_rank for c in range(plan.vpp)]


def boundary_shapes(model: nn.Module, chain: Chain, source: ModelSource,
                    tokens: torch.Tensor) -> dict[int, tuple[int, ...]]:
    """Shape of the input of each chain layer (index > 0) for ``tokens``, from one forward."""
    shapes: dict[int, tuple[int, ...]] = {}
    named = dict(model.named_modules())
    handles = []
    for index, name in enumerate(chain.names):
        if 0 < index < len(chain.names) - 1:
            def hook(_m, args, index=index):
                shapes.setdefault(index, tuple(args[0].shape))
            handles.append(named[name].register_forward_pre_hook(hook))
    with torch.no_grad(), math_attention():
        out = model(tokens)
    shapes[len(chain.names) - 1] = tuple(out.shape)
    for handle in handles:
        handle.remove()
    return shapes


def _sequence_fns(tp_mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def shard(x):
        return DTensor.from_local(x, tp_mesh, [Replicate()], run_check=False).redistribute(
            tp_mesh, [Shard(1)]).to_local()

    def gather(x):
        return DTensor.from_local(x, tp_mesh, [Shard(1)], run_check=False).redistribute(
            tp_mesh, [Replicate()]).to_local()
    return shard, gather


def vocab_styles(graph: LayerGraph, stage: StageModule) -> dict[str, object]:
    """The ``parallelize_module`` plan of the vocabulary-sized layers a stage owns, as Megatron
    splits them (and as the trace counts them, ``Layer.params_sharded``): embedding tables with
    the vocabulary's rows split across TP ranks (RowwiseParallel: each rank looks up its rows,
    an all-reduce sums), the LM head column-parallel with its logits gathered for model.py's
    loss."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    vocab = graph.dims.vocab_size if graph.dims else None
    named = dict(stage.model.named_modules())
    styles = {}
    for unit, module in stage.owned_modules():
        for sub_name, sub in module.named_modules():
            name = f"{unit}.{sub_name}" if sub_name else unit
            if isinstance(sub, nn.Embedding) and vocab and sub.num_embeddings == vocab:
                styles[name] = RowwiseParallel(input_layouts=Replicate(),
                                               output_layouts=Replicate())
    for layer in graph.layers:
        if layer.kind is LayerKind.HEAD:
            for gemm in layer.gemms:
                if gemm.name in named and any(gemm.name == u or gemm.name.startswith(u + ".")
                                              for u in stage.owned):
                    styles[gemm.name] = ColwiseParallel(output_layouts=Replicate())
    return styles


def _grad_as_param(param) -> None:
    """Lay a gradient out as its parameter: DTensor computes an embedding table's gradient
    replicated (every TP rank the whole table); a vocab-parallel rank keeps its own rows, as
    Megatron's does (slicing, no communication)."""
    if param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)


def _retie(model: nn.Module, tied: list[list[str]]) -> None:
    """Point every module of a tied group at the first one's (now sharded) parameter:
    ``parallelize_module`` gives each module a parameter of its own. Tied modules shard the
    vocabulary the same way (rows of the table, columns of the head), so one DTensor serves
    both."""
    for names in tied:
        real = [n for n in names if model.get_parameter(n).device.type != "meta"]
        for name in real[1:]:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, model.get_parameter(real[0]))


def _tied_names(model: nn.Module) -> list[list[str]]:
    """Names of the parameters shared by several modules, one list per shared parameter."""
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)
    return [names for names in owners.values() if len(names) > 1]


def _parallelize_stage(stage: StageModule, graph: LayerGraph, plan: Plan, mesh) -> None:
    """TP, activation checkpointing and FSDP on the layers a stage owns."""
    from torch.distributed.tensor.parallel import parallelize_module
    if plan.tp > 1:
        tied = _tied_names(stage.model)
        styles = vocab_styles(graph, stage)
        parallelize_module(stage.model, mesh["tp"], styles)
        _retie(stage.model, tied)
        for name in styles:
            for param in stage.model.get_submodule(name).parameters():
                param.register_post_accumulate_grad_hook(_grad_as_param)
    named = dict(stage.model.named_modules())
    block_names = {stage.chain.names[i] for i in stage.chain.blocks}
    owned_blocks = [n for n in stage.owned if n in block_names]
    # With recompute_num_layers only the chunk's first N blocks are checkpointed (Megatron's
    # --recompute-method block).
    recomputed = plan.recompute_num_layers or len(owned_blocks)
    for position, name in enumerate(owned_blocks):
        block = named[name]
        if plan.tp > 1:
            parallelize_module(block, mesh["tp"], tp_styles(
                graph, stage.chain, block, sequence_parallel=plan.sequence_parallel))
        if plan.recompute is not Recompute.NONE and position < recomputed:
            parent, _, child = name.rpartition(".")
            setattr(named[parent] if parent else stage.model, child,
                    _checkpointed(block, plan.recompute))
    if plan.dp > 1 and plan.zero_stage > 0:
        from torch.distributed.fsdp import fully_shard
        named = dict(stage.model.named_modules())
        reshard = plan.zero_stage == 3
        for name in owned_blocks:
            fully_shard(named[name], mesh=mesh["dp"], reshard_after_forward=reshard)
        # The stage is the root; the meta copies of other stages' layers stay out of FSDP.
        meta = {p for p in stage.parameters() if p.device.type == "meta"}
        fully_shard(stage, mesh=mesh["dp"], reshard_after_forward=reshard, ignored_params=meta)


def _tied_groups(model: nn.Module, plan: Plan, mesh, stages: dict[int, StageModule],
                 chain: Chain) -> list[tuple[object, list[nn.Parameter]]]:
    """Process groups and local parameters of weights shared by modules on different pipeline
    ranks; every rank creates every group, in the same order (``new_group`` is collective)."""
    out = []
    names_by_stage = _unit_stage(model, chain, plan)
    coords = mesh.mesh  # global ranks, dims outermost first
    pp_dim = mesh.mesh_dim_names.index("pp")
    for names in _tied_names(model):
        holders = {}
        for name in names:
            stage = names_by_stage.get(name.rsplit(".", 1)[0])
            if stage is not None:
                holders.setdefault(stage % plan.pp, []).append((stage, name))
        if len(holders) < 2:
            continue
        ranks_along_pp = coords.movedim(pp_dim, -1).reshape(-1, plan.pp)
        for row in ranks_along_pp.tolist():
            members = sorted(row[r] for r in holders)
            group = dist.new_group(members)
            if dist.get_rank() in members:
                mine = [stages[s].model.get_parameter(n)
                        for s, n in holders[mesh.get_local_rank("pp")] if s in stages]
                out.append((group, mine[:1]))
    return out


def _unit_stage(model: nn.Module, chain: Chain, plan: Plan) -> dict[str, int]:
    """Module name -> the stage that owns it, for every module of the chain units."""
    from autoplan.verify.chain import pre_units
    units = pre_units(model, chain)
    owner: dict[str, int] = {}
    for stage_index, stage in enumerate(plan.stages):
        for index in range(stage.first_layer, stage.first_layer + stage.num_layers):
            layer = chain.names[index]
            for unit in (units if index == 0 else [] if layer == LOSS else [layer]):
                owner[unit] = stage_index
    named = dict(model.named_modules())
    out = {}
    for unit, stage_index in owner.items():
        for sub, _ in named[unit].named_modules():
            out[f"{unit}.{sub}" if sub else unit] = stage_index
    return out


def build_rank(source: ModelSource, graph: LayerGraph, plan: Plan, *, seed: int,
               seq_len: int) -> RankModel:
    """This process's part of ``plan`` (the process group must be initialised)."""
    from torch.distributed.device_mesh import init_device_mesh
    if plan.cp > 1:
        raise NotImplementedError("context parallelism is not built here (cp must be 1)")
    dims = mesh_dims(plan)
    mesh = init_device_mesh("cpu", tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))
    chain = Chain.of(graph)
    model = build_reference(source, seed=seed)
    sample = torch.zeros(plan.micro_batch_size, seq_len, dtype=torch.long)
    shapes = boundary_shapes(model, chain, source, sample)
    shard, gather = _sequence_fns(mesh["tp"]) if plan.sequence_parallel else (None, None)
    pp_rank = mesh.get_local_rank("pp")
    stages = {}
    for index in _stage_indices(plan, pp_rank):
        spec = plan.stages[index]
        stage = StageModule(model, chain, spec.first_layer,
                            spec.first_layer + spec.num_layers - 1, sample_shape=tuple(sample.shape),
                            sequence_parallel=plan.sequence_parallel and plan.tp > 1,
                            shard_sequence=shard, gather_sequence=gather)
        _parallelize_stage(stage, graph, plan, mesh)
        stage.install_hooks()
        stages[index] = stage
    tied = _tied_groups(model, plan, mesh, stages, chain) if plan.pp > 1 else []
    schedule = _schedule(plan, stages, chain, shapes, mesh, source) if plan.pp > 1 else None
    params = list({id(p): p for s in stages.values() for p in s.parameters()
                   if p.device.type != "meta"}.values())
    optimizer = torch.optim.Adam(params, lr=LEARNING_RATE, foreach=False)
    return RankModel(plan, source, mesh, [stages[i] for i in sorted(stages)], schedule,
                     optimizer, params, tied)


def _io_example(chain: Chain, shapes, boundary: int, plan: Plan, mbs_tokens) -> torch.Tensor:
    if boundary == 0:
        return mbs_tokens
    shape = list(shapes[boundary])
    if plan.sequence_parallel and plan.tp > 1 and chain.is_sequence_sharded(boundary):
        shape[1] //= plan.tp
    return torch.empty(shape, requires_grad=True)


def _schedule(plan: Plan, stages: dict[int, StageModule], chain: Chain, shapes, mesh,
              source: ModelSource):
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)
    num_stages = len(plan.stages)
    pipeline_stages = []
    for index, stage in sorted(stages.items()):
        spec = plan.stages[index]
        first, end = spec.first_layer, spec.first_layer + spec.num_layers
        sample = torch.zeros(stage.sample_shape, dtype=torch.long)
        out_boundary = end if end < len(chain.names) else len(chain.names) - 1
        inputs = _io_example(chain, shapes, first, plan, sample)
        outputs = _io_example(chain, shapes, out_boundary, plan, sample)
        pipeline_stages.append(PipelineStage(stage, index, num_stages, torch.device("cpu"),
                                             input_args=inputs, output_args=outputs,
                                             group=mesh.get_group("pp")))
    loss_fn = lambda output, target: loss_of(source, output, target)
    if plan.vpp == 1 and plan.num_microbatches < plan.pp:
        # 1F1B needs a micro-batch per stage; with fewer, GPipe runs the same arithmetic.
        return ScheduleGPipe(pipeline_stages[0], plan.num_microbatches, loss_fn=loss_fn)
    if plan.vpp == 1:
        return Schedule1F1B(pipeline_stages[0], plan.num_microbatches, loss_fn=loss_fn)
    return ScheduleInterleaved1F1B(pipeline_stages, plan.num_microbatches, loss_fn=loss_fn)
