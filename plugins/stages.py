"""The plan's pipeline stages seen as layer kinds, the form every target's partition needs.

``Plan.stages`` indexes the traced layer chain, where embedding, each transformer block, the final
norm, the head and the loss are each one layer; frameworks count transformer blocks only and
attach the rest to the first or last stage. Stages are listed in pipeline order: with ``vpp``
model chunks per rank, stage ``s`` runs on pipeline rank ``s % pp`` as its chunk ``s // pp``
(Megatron's and torchtitan's order).
"""

from __future__ import annotations

from autoplan.errors import ExportError
from autoplan.plan import Result
from autoplan.plugins.summary import require_model


def stage_kinds(result: Result) -> list[tuple[str, ...]]:
    """The layer kinds of each stage, after checking that the stages cover the chain in order.

    Raises:
        ExportError: stages overlap, leave gaps, or run past the model's layers.
    """
    kinds = require_model(result).layer_kinds
    expected_first = 0
    out = []
    for index, stage in enumerate(result.plan.stages):
        if stage.first_layer != expected_first:
            raise ExportError(
                f"plan stage {index} starts at layer {stage.first_layer} but the previous stage "
                f"ends at layer {expected_first}; stages must cover the layer chain in order."
            )
        expected_first += stage.num_layers
        out.append(tuple(kinds[stage.first_layer:expected_first]))
    if expected_first != len(kinds):
        raise ExportError(
            f"the plan's stages cover {expected_first} layers but the model has {len(kinds)}; "
            "the plan JSON does not belong to this model."
        )
    return out


def blocks_per_stage(result: Result) -> list[int]:
    """Transformer blocks in each stage (pipeline order), checked against ``model.num_layers``.

    Raises:
        ExportError: the block count differs from the model's ``num_layers``.
    """
    counts = [kinds.count("block") for kinds in stage_kinds(result)]
    model = require_model(result)
    if model.num_layers is not None and sum(counts) != model.num_layers:
        raise ExportError(
            f"the layer chain has {sum(counts)} transformer blocks but model.num_layers is "
            f"{model.num_layers}; the plan JSON is inconsistent, re-run 'autoplan solve'."
        )
    return counts


def require_ends(result: Result, target: str) -> None:
    """Check that the embedding opens the first stage's work and the norm, head and loss sit on
    the last stage, the only place ``target`` can put them.

    Raises:
        ExportError: naming the stage that holds an end layer elsewhere.
    """
    stages = stage_kinds(result)
    last = len(stages) - 1
    for index, kinds in enumerate(stages):
        misplaced = ({"embedding"} & set(kinds) if index != 0 else set()) | (
            {"norm", "head", "loss"} & set(kinds) if index != last else set())
        if misplaced:
            raise ExportError(
                f"plan stage {index} holds {', '.join(sorted(misplaced))}, but {target} keeps the "
                "embedding on the first stage and the final norm, head and loss on the last; "
                "re-plan with those layers pinned to the end stages."
            )
