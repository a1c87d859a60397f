"""Colossal-AI: keyword arguments of ``colossalai.booster.plugin.HybridParallelPlugin``.

``HybridParallelPlugin(**json.load(open("colossalai_plugin.json")))`` builds the plan's mesh.
Its own assertions, checked here first: ZeRO stage 0-2 only (ZeRO-3 is the GeminiPlugin), at
most ZeRO-1 with a pipeline, Megatron-style sequence parallelism (``split_gather``) only with
TP, and ``num_layers_per_stage`` one entry per pipeline rank (so uneven interleaved stages cannot
be given). Context parallelism is its ``ring_attn`` sequence-parallel mode over ``sp_size``.

Recompute is not a plugin argument (the model's ``gradient_checkpointing_enable()`` or a
``gradient_checkpoint_config`` object sets it), so a sibling note says what to do.
"""

from __future__ import annotations

import json

from autoplan.errors import ExportError
from autoplan.plan import Offload, Recompute, Result
from autoplan.plugins.exporter import Exporter
from autoplan.plugins.capable import capability_problems
from autoplan.plugins.stages import blocks_per_stage
from autoplan.plugins.summary import comment_header, precision

KWARGS_FILE = "colossalai_plugin.json"
NOTE_FILE = "colossalai_plugin.txt"


def check(result: Result) -> None:
    """Refuse plans HybridParallelPlugin asserts against.

    Raises:
        ExportError: saying which rule fails and what to change.
    """
    plan = result.plan
    problems = capability_problems(result, "colossalai") + [problem for problem, bad in (
        ("sequence parallelism with TP and context parallelism are separate modes; pick one",
         plan.sequence_parallel and plan.cp > 1),
        ("sequence parallelism (split_gather) needs tp > 1", plan.sequence_parallel and plan.tp == 1),
    ) if bad]
    if problems:
        raise ExportError("Colossal-AI's HybridParallelPlugin cannot run this plan: "
                          + "; ".join(problems) + ".")


def _sequence_kwargs(result: Result) -> dict:
    plan = result.plan
    if plan.cp > 1:
        return {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "ring_attn",
                "sp_size": plan.cp}
    if plan.sequence_parallel:
        return {"enable_sequence_parallelism": True, "sequence_parallelism_mode": "split_gather"}
    return {"enable_sequence_parallelism": False}


def _pipeline_kwargs(result: Result) -> dict:
    plan = result.plan
    if plan.pp == 1:
        return {}
    kwargs = {"pp_style": "interleaved" if plan.vpp > 1 else "1f1b",
              "num_model_chunks": plan.vpp, "num_microbatches": plan.num_microbatches}
    if plan.vpp == 1:
        kwargs["num_layers_per_stage"] = blocks_per_stage(result)
    return kwargs


def colossalai_plugin_kwargs(result: Result) -> dict:
    """``HybridParallelPlugin`` keyword arguments (JSON-serialisable) for the plan.

    Raises:
        ExportError: the plugin cannot run the plan (see :func:`check`).
    """
    check(result)
    plan = result.plan
    return {"tp_size": plan.tp, "pp_size": plan.pp, "precision": precision(result),
            "zero_stage": plan.zero_stage, "cpu_offload": plan.offload == Offload.OPTIMIZER,
            "dp_outside": False,  # pipeline outermost, as planned (its default nests pp in dp)
            **_sequence_kwargs(result), **_pipeline_kwargs(result)}


def render(result: Result) -> dict[str, str]:
    """``colossalai_plugin.json`` and its note."""
    kwargs = colossalai_plugin_kwargs(result)
    recompute = {
        Recompute.NONE: "The plan does not recompute activations: leave gradient checkpointing off.",
        Recompute.SELECTIVE: "The plan recomputes the attention core only: Colossal-AI has no "
                             "such mode; full checkpointing of every block is the nearest.",
        Recompute.FULL: "The plan recomputes every block: call model.gradient_checkpointing_enable()"
                        " before booster.boost().",
    }[result.plan.recompute]
    note = comment_header(result, title=f"Colossal-AI: HybridParallelPlugin(**json.load(open("
                          f"'{KWARGS_FILE}')))", notes=(recompute,), prefix="")
    return {KWARGS_FILE: json.dumps(kwargs, indent=2) + "\n", NOTE_FILE: note}


exporter = Exporter(name="colossalai", description="Colossal-AI HybridParallelPlugin keyword "
                    "arguments", render=render)
