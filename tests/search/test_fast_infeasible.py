"""An infeasible question on a large cluster is answered from the memory-leanest shapes of each
family, not by evaluating every candidate (issue 14 item 8: Llama 3 405B on 8,192 H100 ran six
minutes, then died in explain_conflict)."""

from __future__ import annotations

import math

import pytest

from autoplan import api
from autoplan.costmodels.step import estimate
from autoplan.errors import InfeasibleError
from autoplan.plan import one_line
from autoplan.search.brute import brute_force
from autoplan.search.conflicts import conflict_if_nothing_fits
from autoplan.search.solve import solve_search
from autoplan.search.table import Table
from autoplan.search.space import candidate_plans, family_of, leanest_members, shapes
from autoplan.training import Objective, Pins
from autoplan.problems import make_problem, training_spec
from tests.search.test_solver import cluster, tiny_gpt

BIG = {"preset": "dgx-h100", "nodes": 1024}  # 8,192 GPUs


@pytest.fixture(scope="module")
def problem():
    model = tiny_gpt(4, 64, 4)
    training = training_spec(256, 2048, "bf16", "megatron", "flash")
    return make_problem(model, api.load_cluster(BIG), training, mem_limit=2**20)  # 1 MiB


def test_nothing_fitting_is_found_from_each_familys_leanest_shapes_only(problem):
    table = Table.build(problem, Pins(), every_dp=True)
    assert len(table) and not table.eligible()
    every = shapes(problem.graph, world=8192, gpus_per_node=8, training=problem.training,
                   pins=Pins(), every_dp=True)
    front = leanest_members(every)
    fronts = {(family, s.dp, s.mbs) for family, members in front.items() for s in members}
    for plan in table.plans:
        family = (plan.tp, plan.pp, plan.cp, plan.vpp, plan.ep)
        assert (family, plan.dp, plan.micro_batch_size) in fronts
    assert len(table) < len(every)  # far fewer rows than shapes, let alone plans


def test_pinned_degrees_that_do_not_fit_get_exit_3_naming_them(problem):
    """Pins like the issue's on 8,192 GPUs (TP 4 x PP 4 x DP 512, no recompute; the model has
    four blocks) under a 1 MiB limit: exit 3 saying nothing fits, no traceback."""
    pins = {"tp": 4, "pp": 4, "dp": 512, "recompute": "none"}
    with pytest.raises(InfeasibleError, match="nothing fits in"):
        api.solve(tiny_gpt(4, 64, 4), BIG, seq_len=256, global_batch=2048, pins=pins,
                  mem_limit=2**20)


def test_family_of_ignores_dp_mbs_and_placement(problem):
    shape = shapes(problem.graph, world=64, gpus_per_node=8, training=problem.training,
                   pins=Pins())[0]
    assert family_of(shape) == (shape.tp, shape.pp, shape.cp, shape.vpp, shape.ep)


# --- Conflicts answered from each family's memory-leanest plans, checked against enumeration.

PINS = Pins(tp=2, pp=2, dp=4, recompute="none")
LABELS = {"tp": "--tp 2", "pp": "--pp 2", "dp": "--dp 4", "recompute": "--recompute none"}


def _small(mem_limit):
    training = training_spec(256, 32, "bf16", "megatron", "flash")
    return make_problem(tiny_gpt(4, 256, 4), api.load_cluster(cluster(2, 8, False)),
                            training, mem_limit=mem_limit)


def _peaks(problem, pins):
    """Worst-GPU bytes of every plan meeting ``pins`` (every DP degree), by enumeration."""
    return [estimate(problem, plan).peak_memory_gib * 2**30
            for plan in candidate_plans(problem.graph, world=16, gpus_per_node=8,
                                        training=problem.training, pins=pins, every_dp=True)]


def _without(pins, *names):
    return Pins(**{k: v for k, v in pins.pinned().items() if k not in names})


@pytest.fixture(scope="module")
def squeezed():
    """A limit halfway between the leanest plan of PINS (no recompute) and the leanest once
    recomputation is free: the pins fit only by recomputing."""
    probe = _small(40 * 2**30)  # the a100-sxm4-40gb
    pinned = min(_peaks(probe, PINS))
    recomputing = min(_peaks(probe, _without(PINS, "recompute")))
    assert recomputing < pinned
    return _small((pinned + recomputing) / 2)


def test_the_conflict_is_the_minimal_set_enumeration_finds(squeezed):
    """Deletion in the documented order (tp, pp, dp, recompute, memory), each set decided by
    enumerating every plan under it: the requirements left are the ones named, the leanest
    plan under them needs what enumeration says, and the plan without the first of them is
    the brute-force optimum."""
    limit = squeezed.mem_limit_bytes
    fits = lambda pins: min(_peaks(squeezed, pins)) <= limit
    kept = dict(PINS.pinned())
    for name in list(kept):
        rest = Pins(**{k: v for k, v in kept.items() if k != name})
        if not fits(rest):
            del kept[name]
    assert kept  # the limit does not stop every plan
    with pytest.raises(InfeasibleError) as err:
        solve_search(squeezed, PINS, time_limit_s=60)
    message = str(err.value)
    named = " and ".join(LABELS[k] for k in kept)
    assert message.startswith(f"{named} together with ")
    leanest = min(_peaks(squeezed, Pins(**kept))) / 2**30
    need = float(message.split(") needs ")[1].split(" GiB")[0])
    assert need == pytest.approx(leanest, abs=5e-4)  # printed with three decimals
    over = message.split(" GiB on stage ")[1].split("(")[1].split(" over")[0]
    # under 0.1 GiB over: whole MiB as the solver compares (need rounded up, limit down)
    assert over == f"{math.ceil(leanest * 1024) - math.floor(limit / 2**20)} MiB"
    # the first of them whose removal from all the pins admits a plan
    first, (plan, _) = next((k, found) for k in kept
                            if (found := brute_force(squeezed, _without(PINS, k))) is not None)
    assert f"without {LABELS[first]} the best plan ({one_line(plan)}) fits" in message
    assert err.value.exit_code == 3 and "\n" not in message


def test_nothing_fits_is_known_before_the_step_time_search(squeezed, monkeypatch):
    """The screen decides infeasibility from memory alone: with the time search's table
    builds forbidden for the solve's own pins, the answer still comes (the only build left
    is the one that prices the plan without a conflicting pin)."""
    built = []
    real = Table.build.__func__

    def recording(cls, problems, pins, **kwargs):
        built.append(pins)
        return real(cls, problems, pins, **kwargs)

    monkeypatch.setattr(Table, "build", classmethod(recording))
    with pytest.raises(InfeasibleError, match="together with"):
        solve_search(squeezed, PINS, time_limit_s=60)
    assert PINS not in built and len(built) == 1


def test_a_fitting_plan_lets_the_search_run(squeezed):
    assert conflict_if_nothing_fits([squeezed], _without(PINS, "recompute"),
                                    objective=Objective(), bounds=None, max_gpus=None) is None


def test_llama3_405b_pinned_on_8192_h100_gets_one_paragraph_naming_the_conflict(examples):
    """The issue's case (Llama 3 405B, TP 8 x PP 16 x DP 64 without recompute at 8,192
    tokens on 1,024 DGX H100; 95% of the 81,559 MiB an H100 offers, 75.7 GiB, usable) on Megatron: exit 3 naming PP 16, DP 64
    and no recomputation, by how much the leanest such plan is over, and the plan that fits
    once the pipeline depth is free (the other pins kept: with the blocks' activations as
    megatron-core with Transformer Engine saves them, half as deep a pipeline with CP fits)."""
    model = api.load_model(examples / "models" / "llama3_405b.py")
    with pytest.raises(InfeasibleError) as err:
        api.solve(model, BIG, seq_len=8192, global_batch=2048, runtime="megatron",
                  pins={"tp": 8, "pp": 16, "dp": 64, "recompute": "none"}, runners_up=False)
    message = str(err.value)
    assert err.value.exit_code == 3 and "\n" not in message
    assert message.startswith("--pp 16 and --dp 64 and --recompute none together with 75.7 GiB "
                              "per GPU: the leanest such plan (")
    need = float(message.split(") needs ")[1].split(" GiB")[0])
    over = float(message.split("GiB on stage ")[1].split("(")[1].split(" GiB over")[0])
    usable = 0.95 * 81559 / 1024
    # both printed to 0.1 GiB: each off by at most 0.05
    assert need > usable and over == pytest.approx(need - usable, abs=0.1)
    relaxed = message.split("without --pp 16 the best plan (")[1].split(")")[0]
    assert relaxed.startswith("TP8 x ") and "DP64" in relaxed and "no recompute" in relaxed
    assert "PP16" not in relaxed
    assert message.endswith("Relax one of these.")
