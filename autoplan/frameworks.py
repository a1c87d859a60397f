"""Which framework: solve the same question on every runtime (Megatron-LM, DeepSpeed, FSDP) and
keep the best, with each runtime's own best plan or the reason it has none.

One exact solve per runtime (each with its own capability table, ``autoplan.capabilities``)
rather than one table over all of them: each runtime's best plan is then exact, as the
``runtimes`` list promises, at the cost of three solves (side by side where there are
cores: below). Pins a runtime lacks (``--zero 3`` on Megatron-LM) skip it with the reason;
when no runtime is left the error names, for each, what it lacks and who has it.

Ties between runtimes are broken as the solver breaks ties between plans (objective key,
then fewer GPUs, then smaller tp*pp, then less memory) and last by the order of
``SEARCH_ORDER``: Megatron-LM, DeepSpeed, FSDP.

On a machine with more than one core the searches run side by side (:class:`SideBySide`):
every runtime but the first in a forked child of its own (``autoplan.forked``), the first
here. The answers are the same as one after another (a search that finishes within its time
limit does not depend on when it ran); the wall time is the longest search's, not the sum.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from autoplan.capabilities import RUNTIMES, Feature, can_run, lack_reason, missing
from autoplan.cluster.loaded import LoadedCluster
from autoplan.costmodels.step import estimate
from autoplan.errors import (AutoplanError, ConstraintError, InfeasibleError,
                             NoPlanInTimeError)
from autoplan.forked import ForkedWorker, can_fork, usable_cores
from autoplan.graph.model import Model
from autoplan.plan import Estimate, Plan, Result, RuntimeOption, TrainingInfo, ZeroOption
from autoplan.problems import Profile, make_problem, training_spec
from autoplan.search.objective import key as objective_key
from autoplan.training import Objective, Runtime

AUTO = "auto"
SEARCH_ORDER = tuple(Runtime)


def runtimes_to_search(runtime: str | None) -> list[Runtime]:
    """Every runtime for ``auto`` (or None), else the one named.

    Raises:
        ConstraintError: an unknown name.
    """
    if runtime in (None, AUTO):
        return list(SEARCH_ORDER)
    try:
        return [Runtime(runtime)]
    except ValueError:
        raise ConstraintError(f"--runtime {runtime!r} is not known; choose one of auto, "
                              f"{', '.join(r.value for r in Runtime)}.") from None


def order_key(result: Result, objective: Objective, per_token: bool) -> tuple:
    """The solver's order across runtimes (see the module docstring)."""
    plan, est = result.plan, result.estimate
    tokens = plan.global_batch_size * result.training.seq_len
    return objective_key(objective, est.step_time_s, plan.world_size, tokens,
                         per_token=per_token) + (
        plan.world_size, plan.tp * plan.pp, est.peak_memory_gib,
        SEARCH_ORDER.index(Runtime(result.training.runtime)))


def _option(runtime: Runtime, result: Result | None, status: str, reason: str | None
            ) -> RuntimeOption:
    return RuntimeOption(
        runtime=runtime.value, status=status,
        step_time_s=result.estimate.step_time_s if result else None,
        peak_memory_gib=result.estimate.peak_memory_gib if result else None,
        plan=result.plan if result else None, reason=reason)


_STATUS = {InfeasibleError: "INFEASIBLE", NoPlanInTimeError: "NO_PLAN_IN_TIME"}


SHARDED_STAGES = (2, 3)
"""Shown side by side where a runtime has both and both fit: ZeRO-3 saves memory for more
communication, and practice keeps stage 2 when memory allows."""


def zero_options(at_zero: Callable[[Runtime, int], tuple[Plan, Estimate]], runtime: Runtime,
                 best: Result) -> list[ZeroOption]:
    """The runtime's best ZeRO-2 and ZeRO-3 plans (``at_zero(runtime, zero)``: the plan and
    its estimate) when it has both stages and both fit (one of them may be ``best`` itself);
    empty otherwise."""
    if not set(SHARDED_STAGES) <= set(RUNTIMES[runtime].zero_stages):
        return []
    found = []
    for zero in SHARDED_STAGES:
        try:
            plan, est = ((best.plan, best.estimate) if best.plan.zero_stage == zero
                         else at_zero(runtime, zero))
        except AutoplanError:
            return []
        found.append(ZeroOption(runtime=runtime.value, zero_stage=zero,
                                step_time_s=est.step_time_s,
                                peak_memory_gib=est.peak_memory_gib, plan=plan))
    return found


def compare(solve_for: Callable[..., Result], runtimes: list[Runtime],
            features: list[Feature], *, objective: Objective, per_token: bool,
            time_limit_s: float, zero_pinned: bool = False,
            at_zero: Callable[[Runtime, int], tuple[Plan, Estimate]] | None = None) -> Result:
    """The best of ``solve_for(runtime)`` over the ``runtimes`` that have every pinned
    feature, with the ``runtimes`` list filled in and, unless the ZeRO stage is pinned, the
    ZeRO-2 and ZeRO-3 plans of runtimes where both fit (``at_zero(runtime, zero)``, by
    default the plan and estimate of ``solve_for(runtime, zero)``).

    Raises:
        InfeasibleError: no runtime has what the pins ask, or none has a plan that fits.
        NoPlanInTimeError: every runtime searched ran out of time.
        ConstraintError: the input is wrong for every runtime (one runtime: its error as is).
    """
    options, solved, errors, zeros = [], [], [], []
    for runtime in runtimes:
        lacking = missing(runtime, features)
        if lacking:
            options.append(_option(runtime, None, "UNSUPPORTED", lack_reason(runtime, lacking)))
            continue
        try:
            result = solve_for(runtime)
        except AutoplanError as err:
            if len(runtimes) == 1:
                raise
            errors.append(err)
            options.append(_option(runtime, None, _STATUS.get(type(err), "INVALID"), str(err)))
            continue
        solved.append(result)
        options.append(_option(runtime, result, result.solver.status, None))
    if not solved:
        raise _no_runtime(options, errors, time_limit_s)
    at_zero = at_zero or (lambda runtime, zero: _plan_and_estimate(solve_for(runtime, zero)))
    for result in [] if zero_pinned else solved:  # after every runtime had its share of time
        zeros += zero_options(at_zero, Runtime(result.training.runtime), result)
    best = min(solved, key=lambda r: order_key(r, objective, per_token))
    return best.model_copy(update={"runtimes": options, "zero_options": zeros or None,
                                   "solver": _overall_bound(best, solved, errors)})


def searches_side_by_side(processes: int | None, runtimes: int) -> bool:
    """Whether ``runtimes`` searches run side by side: more than one, ``processes`` (default:
    the usable cores) more than one, and a platform that forks."""
    processes = usable_cores() if processes is None else processes
    return runtimes > 1 and processes > 1 and can_fork()


class SideBySide:
    """``compare``'s questions about each runtime, answered by searches that run side by side:
    each runtime of ``runtimes[1:]`` is searched in a forked child started here, at once,
    which goes on to the ZeRO-2/ZeRO-3 plans ``zero_options`` will ask for (unless
    ``zero_pinned``) and keeps its search for the runners-up; ``runtimes[0]`` is searched in
    this process when asked, and while this process waits for a child its runners-up are
    found (the runtime most often chosen is first: Megatron-LM). ``solve_for(runtime,
    zero=None)``, ``at_zero(runtime, zero)`` and ``runners_up(runtime)`` (None: none are
    wanted) are the callables the searches run; with ``side_by_side`` False every question is
    answered here, as they are. Use as a context manager: leaving it ends the children."""

    def __init__(self, runtimes: list[Runtime], solve_for: Callable[..., Result],
                 at_zero: Callable[[Runtime, int], tuple[Plan, Estimate]],
                 runners_up: Callable[[Runtime], Any] | None, *, zero_pinned: bool,
                 side_by_side: bool):
        self._solve_for, self._at_zero, self._runners_up = solve_for, at_zero, runners_up
        self._zero_pinned = zero_pinned
        self._here = runtimes[0] if runtimes else None
        self._searched_here = False
        self._runners_up_found: tuple[bool, Any] | None = None  # here: (ok, value or error)
        self._workers: dict[Runtime, ForkedWorker] = {}
        self._searched: dict[Runtime, int] = {}
        self._answers: dict[Runtime, tuple] = {}
        for one in runtimes[1:] if side_by_side else []:
            handlers = {"search": partial(self._search_and_zeros, one),
                        "at_zero": partial(at_zero, one)}
            if runners_up is not None:
                handlers["runners_up"] = partial(runners_up, one)
            try:
                worker = ForkedWorker(handlers, what=f"--runtime {one.value}")
            except OSError:  # no process to be had (limits): the rest are searched here
                break
            self._workers[one] = worker
            self._searched[one] = worker.submit("search")

    def __enter__(self) -> "SideBySide":
        return self

    def __exit__(self, *exc) -> None:
        for worker in self._workers.values():
            worker.close()

    def solve_for(self, runtime: Runtime, zero: int | None = None) -> Result:
        if runtime not in self._workers or zero is not None:
            result = self._solve_for(runtime, zero)
            if runtime == self._here and zero is None:
                self._searched_here = True
            return result
        found = self._answer(runtime)[0]
        if isinstance(found, AutoplanError):
            raise found
        return found

    def at_zero(self, runtime: Runtime, zero: int) -> tuple[Plan, Estimate]:
        if runtime not in self._workers:
            return self._at_zero(runtime, zero)
        asked = self._answer(runtime)[1]
        if zero not in asked:  # not one zero_options asks for: searched there now
            return self._workers[runtime].call("at_zero", zero)
        return _unwrapped(asked[zero])

    def runners_up(self, runtime: Runtime) -> Any:
        if self._runners_up is None:
            return None
        if runtime in self._workers:
            return self._workers[runtime].call("runners_up")
        if runtime == self._here:
            self._runners_up_here()
            return _unwrapped(self._runners_up_found)
        return self._runners_up(runtime)

    def _answer(self, runtime: Runtime) -> tuple:
        """A child's search answer, its runners-up found here first while it is not ready."""
        if runtime not in self._answers:
            worker, ticket = self._workers[runtime], self._searched[runtime]
            if not worker.ready(ticket):
                self._runners_up_here()
            self._answers[runtime] = worker.result(ticket)
        return self._answers[runtime]

    def _runners_up_here(self) -> None:
        """The runners-up of the runtime searched here, once it was searched (kept, with the
        error that stopped them)."""
        if (self._runners_up is None or not self._searched_here
                or self._runners_up_found is not None):
            return
        try:
            self._runners_up_found = (True, self._runners_up(self._here))
        except AutoplanError as err:
            self._runners_up_found = (False, err)

    def _search_and_zeros(self, runtime: Runtime) -> tuple:
        """(the runtime's best plan or its error, the answers of the ZeRO-stage searches
        ``zero_options`` asks for, by stage: (True, plan and estimate) or (False, error)),
        run in the child."""
        try:
            result = self._solve_for(runtime)
        except AutoplanError as err:
            return err, {}
        asked: dict[int, tuple[bool, Any]] = {}

        def recorded(one: Runtime, zero: int) -> tuple[Plan, Estimate]:
            try:
                asked[zero] = (True, self._at_zero(one, zero))
            except AutoplanError as err:
                asked[zero] = (False, err)
            return _unwrapped(asked[zero])

        if not self._zero_pinned:
            zero_options(recorded, runtime, result)
        return result, asked


def _unwrapped(answer: tuple[bool, Any]) -> Any:
    """The value of an (ok, value or error) answer, or its error raised."""
    ok, value = answer
    if not ok:
        raise value
    return value


def _plan_and_estimate(result: Result) -> tuple[Plan, Estimate]:
    return result.plan, result.estimate


def _overall_bound(best: Result, solved: list[Result], errors: list[AutoplanError]):
    """The chosen plan's solver report with a bound that holds over every runtime: the least
    bound of any runtime searched (0 for one that found nothing in time)."""
    info = best.solver
    bound = min([r.solver.bound for r in solved]
                + [0.0 for e in errors if isinstance(e, NoPlanInTimeError)])
    if bound >= info.bound:
        return info
    gap = (info.objective - bound) / info.objective if info.objective else 0.0
    return info.model_copy(update={"status": "FEASIBLE", "bound": bound, "gap": gap})


def _no_runtime(options: list[RuntimeOption], errors: list[AutoplanError],
                time_limit_s: float) -> AutoplanError:
    """The error when no runtime has a plan: every runtime's reason, with the exit code of the
    most telling failure (infeasible over out of time over bad input)."""
    if len(options) == 1 and options[0].status == "UNSUPPORTED":
        return InfeasibleError(f"{options[0].reason}. Change --runtime (or use auto) or leave "
                               "those options unset.")
    text = "; ".join((o.reason if o.status == "UNSUPPORTED" else
                      f"--runtime {o.runtime}: {o.reason}").rstrip(".") for o in options)
    if any(o.status in ("UNSUPPORTED", "INFEASIBLE") for o in options):
        return InfeasibleError(f"no runtime has a plan: {text}.")
    if errors and all(isinstance(e, NoPlanInTimeError) for e in errors):
        return NoPlanInTimeError(
            f"no plan that fits was found within --time-limit {time_limit_s:g}s, shared by the "
            f"{len(errors)} runtimes searched; raise the limit, pin more dimensions or pin "
            "--runtime.")
    return ConstraintError(f"no runtime can take these inputs: {text}.")


def priced_elsewhere(result: Result, model: Model, cluster: LoadedCluster, *,
                     mem_limit: str | float | None, profile: str | Path | Profile | None,
                     attention: str) -> dict[str, Estimate]:
    """The chosen plan's estimate on each other runtime whose capability table runs it (by
    runtime name), so that each export is priced for the runtime it targets."""
    t, out = result.training, {}
    for other in Runtime:
        if other.value == t.runtime or not can_run(RUNTIMES[other], result.plan, t.precision,
                                                   uneven=uneven_chunks(result.plan, model, t)):
            continue
        if t.optimizer_in_backward and not RUNTIMES[other].optimizer_in_backward:
            continue
        training = training_spec(t.seq_len, t.global_batch, t.precision, other.value, attention,
                                 t.optimizer, t.frozen_dtype, t.optimizer_in_backward)
        problem = make_problem(model, cluster, training, mem_limit, profile=profile)
        out[other.value] = estimate(problem, result.plan)
    return out


def uneven_chunks(plan: Plan, model: Model, training: TrainingInfo) -> bool:
    """Whether an interleaved plan's model chunks hold different numbers of blocks."""
    if plan.vpp == 1:
        return False
    blocks = set(model.trace(training.seq_len, training.precision).block_indices())
    counts = {sum(i in blocks for i in range(s.first_layer, s.first_layer + s.num_layers))
              for s in plan.stages}
    return len(counts) > 1
