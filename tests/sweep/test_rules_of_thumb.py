"""The rules of thumb of examples/rules_of_thumb.py, asserted against the solver.

A rule the cost model currently contradicts is xfail with the reason, not forced: the cost
model is calibrated separately and these tests say where it and the lore disagree.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from .conftest import EXAMPLES

_spec = importlib.util.spec_from_file_location("rules_of_thumb", EXAMPLES / "rules_of_thumb.py")
rules = importlib.util.module_from_spec(_spec)
sys.modules["rules_of_thumb"] = rules  # dataclasses look their module up while decorating
_spec.loader.exec_module(rules)

# Both hold on this branch's base (78c0078) and fail on main as of 9ca9660; not strict, so they
# report XPASS here and XFAIL there until the cost model and the lore are reconciled.
XFAIL = {
    "one_gpu_4b_deepspeed": (
        "main's DeepSpeed memory model (f5e457c) keeps an fp32 gradient partition, about 20 B "
        "per parameter, so 4.2B needs optimizer offload under DeepSpeed on one 80 GB GPU (it fits "
        "under Megatron with full recompute): the ~5B rule assumes 16 B/param"),
    "slow_network_pp_7b": (
        "main's solver may leave GPUs idle (316c740) and keeps Llama 2 7B on one node (TP1 PP4 "
        "DP2, 8 GPUs) rather than cross 10 Gb/s Ethernet: one node is faster, the rule's "
        "'multi-node slower than one node' case; with a model that needs both nodes "
        "(slow_network_pp) PP does cross"),
}


@pytest.mark.parametrize("rule", [
    pytest.param(r, marks=pytest.mark.xfail(reason=XFAIL[r.name], strict=False))
    if r.name in XFAIL else r for r in rules.RULES], ids=lambda r: r.name)
def test_rule(rule):
    result, holds = rules.check(rule)
    assert holds, f"{rule.statement}: expected {rule.expect}, solver chose {result.plan}"
