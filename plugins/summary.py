"""The README-style header that every exported file carries: what was planned and what autoplan
predicts for it, so a launch file found on a cluster months later still says where it came from
and what it should achieve.

The text is deterministic (no dates, no versions) so that golden files only change when the plan
or the exporter does.
"""

from __future__ import annotations

from autoplan.capabilities import RUNTIMES
from autoplan.errors import ExportError
from autoplan.plan import ModelInfo, Result, one_line


def seq_len(result: Result) -> int:
    """The training sequence length: the training settings' if present, else the traced model's."""
    if result.training is not None:
        return result.training.seq_len
    return require_model(result).seq_len


def precision(result: Result) -> str:
    """``"bf16"``, ``"fp16"`` or ``"fp8"``; plans made before TrainingInfo existed were bf16."""
    return result.training.precision if result.training is not None else "bf16"


def require_model(result: Result) -> ModelInfo:
    """The model description every target needs for its shape arguments.

    Raises:
        ExportError: the plan JSON carries no ``model`` section.
    """
    if result.model is None:
        raise ExportError(
            "the plan JSON has no 'model' section, so the exporters cannot write model shape "
            "arguments; re-run 'autoplan solve --json' with the current autoplan to get one."
        )
    return result.model


def fine_tuning_line(result: Result) -> str | None:
    """What trains and what is frozen, when not everything trains or the optimizer (or its
    step in backward) or the frozen weights' storage is not the default; None for a plain
    full training."""
    model, training = result.model, result.training
    if model is None or training is None or model.num_trainable_params is None:
        return None
    frozen = model.num_params - model.num_trainable_params
    if not frozen and training.optimizer == "adamw" and not training.optimizer_in_backward:
        return None
    share = model.num_trainable_params / model.num_params if model.num_params else 0.0
    line = (f"Trains {model.num_trainable_params:,} parameters ({share:.2%}) with "
            f"{training.optimizer}")
    if training.optimizer_in_backward:
        line += " stepped in backward (each gradient applied and freed as it is complete: " \
                "one layer's gradients held, no gradient accumulation)"
    if frozen:
        line += f"; {frozen:,} frozen (no gradients, no optimizer state), stored in " \
                f"{training.frozen_dtype or training.precision}"
    return line + "."


def summary_lines(result: Result) -> list[str]:
    """Plain sentences describing the plan and its predicted figures."""
    plan, est = result.plan, result.estimate
    model = result.model.name if result.model is not None else "the model"
    tokens = f" of {seq_len(result)} tokens" if result.training or result.model else ""
    cluster = (result.cluster or {}).get("name") or f"{plan.world_size} GPUs"
    return [
        f"Planned by autoplan for {model} on {cluster}.",
        f"Plan: {one_line(plan)} on {plan.world_size} GPUs (rank order {plan.placement}, "
        "innermost first).",
        f"Batch: micro-batch {plan.micro_batch_size} x {plan.num_microbatches} micro-batches x "
        f"DP {plan.dp} = global batch {plan.global_batch_size} sequences{tokens}, "
        f"{precision(result)}.",
        f"Predicted{_priced_on(result)}: {est.step_time_s:.3f} s/step, {est.tokens_per_s:,.0f} tokens/s, "
        f"MFU {est.mfu:.1%}, peak memory {est.peak_memory_gib:.1f} GiB of "
        f"{est.memory_limit_gib:.1f} GiB per GPU.",
        f"Solver: {result.solver.status}, objective {result.solver.objective:.3f} s, "
        f"gap {result.solver.gap:.1%}.",
        *([line] if (line := fine_tuning_line(result)) else []),
    ]


def _priced_on(result: Result) -> str:
    """`` for DeepSpeed``: the runtime whose cost model priced the figures."""
    names = {runtime.value: caps.name for runtime, caps in RUNTIMES.items()}
    runtime = result.training.runtime if result.training is not None else None
    return f" for {names[runtime]}" if runtime in names else ""


def comment_header(result: Result, *, title: str, notes: tuple[str, ...] = (),
                   prefix: str = "# ") -> str:
    """The header as comment lines (``prefix`` per line), ending with a blank comment line.

    Args:
        result: the plan being exported.
        title: first line, naming the file's purpose.
        notes: target-specific sentences (how to use the file, what the target cannot express).
        prefix: the comment marker of the file's format.
    """
    lines = [title, "", *summary_lines(result)]
    if notes:
        lines += ["", *notes]
    return "".join(f"{prefix}{line}".rstrip() + "\n" for line in lines)
