"""A target's capability table (``autoplan.capabilities``) applied to a plan: the shared part of
every exporter's ``check()``, so a target refuses exactly what its table says it cannot run."""

from __future__ import annotations

from autoplan.capabilities import TARGETS, plan_gaps
from autoplan.plan import Result
from autoplan.plugins.launch import require_target_placement
from autoplan.plugins.stages import blocks_per_stage
from autoplan.plugins.summary import precision


def capability_problems(result: Result, target: str) -> list[str]:
    """Why ``target`` (a key of ``TARGETS``) cannot run the plan, after checking its rank order
    and node groups (raises there: those say which target to use instead).

    Raises:
        ExportError: the plan's placement or node groups are not the target's.
    """
    caps = TARGETS[target]
    require_target_placement(result, caps.name, caps.placements, places_groups=caps.node_groups)
    plan = result.plan
    uneven = plan.vpp > 1 and result.model is not None and len(set(blocks_per_stage(result))) > 1
    gaps = plan_gaps(caps, plan, precision(result), uneven=uneven)
    if result.training is not None and result.training.optimizer_in_backward \
            and not caps.optimizer_in_backward:
        gaps.append("it has no optimizer step in backward (planned with "
                    "--optimizer-in-backward; export to torchtune, or re-plan without it)")
    return gaps
