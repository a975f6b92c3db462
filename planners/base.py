"""The planner interface: a Budget in, a PlanResult out (best plan, its predicted cost, search stats)."""
from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from cost_models import CostModel
from cost_models.coverage import uncovered
from cost_models.scenarios import perturbable
from planners.robust import RobustChoice, objective, robust_plans
from specs import ClusterSpec, ModelSpec, Plan, SpecError
from specs.stack import SoftwareStack
from specs.limits import made_time
from specs.units import GIB

DEFAULT_GLOBAL_BATCH = 32
"""Global batch used when a Budget names neither a batch nor a range."""


@dataclass(frozen=True, kw_only=True)
class Budget:
    """What a plan may use: GPU memory per device and the global batch (fixed or a range)."""

    memory_gib: float
    """Memory per GPU a plan's peak (runtime overhead included) must stay within, GiB."""
    global_batch: int | None = None
    """Samples per iteration; None: see global_batch_range."""
    global_batch_range: tuple[int, int] | None = None
    """(lo, hi): try lo, hi and every power of two between; the best throughput wins."""

    def __post_init__(self) -> None:
        mem = self.memory_gib
        if isinstance(mem, bool) or not isinstance(mem, (int, float)) or not mem > 0 or mem == float("inf"):
            raise SpecError("memory_gib", f"must be a finite number > 0, got {mem!r}")
        if self.global_batch is not None and self.global_batch_range is not None:
            raise SpecError("global_batch", "give global_batch or global_batch_range, not both")
        if self.global_batch is not None:
            _positive(self.global_batch, "global_batch")
        if self.global_batch_range is not None:
            rng = tuple(self.global_batch_range)
            if len(rng) != 2:
                raise SpecError("global_batch_range", f"must be (lo, hi), got {self.global_batch_range!r}")
            lo, hi = (_positive(v, "global_batch_range") for v in rng)
            if lo > hi:
                raise SpecError("global_batch_range", f"lo({lo}) > hi({hi})")
            object.__setattr__(self, "global_batch_range", (lo, hi))

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    def global_batches(self) -> tuple[int, ...]:
        """Candidate global batches, ascending."""
        if self.global_batch is not None:
            return (self.global_batch,)
        if self.global_batch_range is None:
            return (DEFAULT_GLOBAL_BATCH,)
        lo, hi = self.global_batch_range
        out = {lo, hi}
        p = 1
        while p <= hi:
            if p >= lo:
                out.add(p)
            p *= 2
        return tuple(sorted(out))


def time_limit(value: Any) -> float:
    """``time_limit_s`` as seconds, refused up front unless a finite number > 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise SpecError("time_limit_s", f"must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(name, f"must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class SearchStats:
    """How the search went."""

    wall_time_s: float = 0.0
    """Wall-clock time of the whole search."""
    states_explored: int = 0
    """DP states / Pareto points kept, or solver nodes; comparable within one planner."""
    candidates: int = 0
    """Outer-loop configurations (global batch, pp, micro-batches, vocab tp) looked at."""
    pruned: int = 0
    """Of those, how many a lower bound or a memory floor ruled out without a full search."""
    solver_status: str = ""
    """optimal, feasible (time limit hit with a plan), infeasible, heuristic, exhaustive."""
    gap: float | None = None
    """Relative optimality gap the solver proved (0 = optimal); None where no bound exists."""
    bound_s: float | None = None
    """Lower bound on the returned plan's iteration time the solver proved (its group), s; None
    where the solver gives none."""
    tables_s: float = 0.0
    """Of wall_time_s: building the cost tables (the cost model's per-layer answers)."""
    groups_s: float = 0.0
    """Of wall_time_s: solving groups (the DP or the solver); the rest is the outer loops."""
    proof_s: float = 0.0
    """Of groups_s: galvatron's fast mode proving the groups its search left open (exact DP)."""


@dataclass(frozen=True, kw_only=True)
class RankedPlan:
    """One of the top-k plans a search found."""

    plan: Plan
    iteration_time_s: float
    throughput_samples_per_s: float
    peak_memory_gib: float


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """A planner's answer. Time and memory are ``cost_model.plan_cost`` of ``plan``."""

    planner: str
    feasible: bool
    plan: Plan | None = None
    iteration_time_s: float = float("inf")
    throughput_samples_per_s: float = 0.0
    stage_peak_memory_gib: tuple[float, ...] = ()
    """Peak memory of one GPU of each pipeline stage."""
    peak_memory_gib: float = 0.0
    min_memory_gib: float | None = None
    """When infeasible: the smallest per-GPU memory at which this planner's space has a plan."""
    stats: SearchStats = field(default_factory=SearchStats)
    top_k: tuple[RankedPlan, ...] = ()
    message: str = ""
    """Why nothing fits, or notes from the search."""
    bubble_fraction: float = 0.0
    """The cost model's share of the iteration a GPU spends outside per-micro-batch work."""
    robust: RobustChoice | None = None
    """Under objective=robust: the plans compared, each one's regret, and the nominal objective's
    plan beside the one chosen (``plan``); None under the nominal objective."""

    def summary(self) -> str:
        """One line: throughput, time, peak memory, the schedule and its bubble (pipelines only), the plan."""
        if not self.feasible:
            need = f"{self.min_memory_gib:.1f}" if self.min_memory_gib is not None else "?"
            return f"{self.planner}: OOM (needs {need} GiB)"
        pipeline = (f"{self.plan.schedule} bubble {self.bubble_fraction:.1%} | " if self.plan.pp > 1 else "")
        return (f"{self.planner}: {self.throughput_samples_per_s:.2f} samples/s, "
                f"{self.iteration_time_s * 1e3:.1f} ms, peak {self.peak_memory_gib:.2f} GiB | "
                f"{pipeline}{self.plan.summary()}")

    def _repr_html_(self) -> str:
        """Jupyter: a small table instead of the dataclass text."""
        from planners.html import result_html
        return result_html(self)


def scored_result(name: str, cost_model: CostModel, model: ModelSpec, plan: Plan,
                  stats: SearchStats, top_k: tuple[RankedPlan, ...] = (), message: str = "") -> PlanResult:
    """A feasible PlanResult whose numbers come from ``plan_cost`` (the single source of truth)."""
    cost = cost_model.plan_cost(model, plan)
    made_time(cost.iteration_time_s, "iteration_time_s", f"{name}'s plan's iteration time")
    stage = tuple(b / GIB for b in cost.stage_peak_bytes)
    return PlanResult(planner=name, feasible=True, plan=plan, iteration_time_s=cost.iteration_time_s,
                      throughput_samples_per_s=cost.throughput_samples_per_s,
                      stage_peak_memory_gib=stage, peak_memory_gib=max(stage), stats=stats,
                      top_k=top_k, message=message, bubble_fraction=cost.bubble_fraction)


def infeasible_result(name: str, min_memory_bytes: float | None, stats: SearchStats,
                      message: str = "") -> PlanResult:
    need = None if min_memory_bytes is None else min_memory_bytes / GIB
    text = message or ("no plan fits" + (f"; the smallest needs {need:.2f} GiB per GPU" if need else ""))
    return PlanResult(planner=name, feasible=False, min_memory_gib=need, stats=stats, message=text)


class Planner(ABC):
    """Chooses a Plan for (model, cluster) under a Budget, minimising ``cost_model.plan_cost`` time."""

    name: ClassVar[str] = ""

    def plan(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
             options: dict[str, Any] | None = None) -> PlanResult:
        """Search, then time the search; subclasses implement ``_search``.

        Every planner takes ``memory_models``: more cost models whose memory a plan must also fit
        (time still from ``cost_model``; see cost_models.fits_all), and ``precision``
        (``fix_precision``). The budget a search sees is
        ``budget`` less the cost model's allocator reserve (CostModel.allocator_reserve_bytes).
        Every planner also takes ``objective``: ``nominal`` (default) or ``robust``, the plan of
        least worst regret over perturbation ``scenarios`` (a comma-separated list of
        cost_models.scenarios names; default all) among its top plans and each scenario's own
        best (planners/robust.py; ``PlanResult.robust`` says what it compared), or ``auto``
        (the command line's default): robust where the nominal plan leaves the regime the
        measured data covers (cost_models/coverage.py; the message says what), else nominal."""
        start = time.perf_counter()
        options = dict(options or {})
        precision = options.pop("precision", None)
        if precision is not None:
            options = self.fix_precision(options, str(precision), cluster)
        others = tuple(options.pop("memory_models", ()) or ())
        goal = objective(options.pop("objective", "nominal"))
        scenarios = options.pop("scenarios", None)
        if scenarios is not None and goal == "nominal":
            raise SpecError("scenarios", "scenarios are for objective=robust or auto")
        base, full_bytes = cost_model, budget.memory_bytes

        def wrap(cm: CostModel) -> CostModel:
            if not others:
                return cm
            from cost_models.fits_all import FitsAll
            return FitsAll(cm, others, full_bytes)

        cost_model = wrap(base)
        usable = budget.memory_bytes - cost_model.allocator_reserve_bytes(budget.memory_bytes)
        budget = replace(budget, memory_gib=usable / GIB)
        result = _with_stack(self._search(model, cluster, budget, cost_model, dict(options)), base.stack)
        why = _uncovered(base, result) if goal == "auto" else ()
        if (goal == "robust" or why) and result.feasible:
            def search(cm: CostModel) -> tuple[Plan, ...]:
                found = _with_stack(self._search(model, cluster, budget, cm, dict(options)), base.stack)
                return (found.plan, *(k.plan for k in found.top_k)) if found.feasible else ()
            choice = robust_plans(search, model, base, (result.plan, *(k.plan for k in result.top_k)),
                                  scenarios, wrap)
            stats = replace(result.stats, solver_status="robust", gap=None, bound_s=None)
            choice = replace(choice, reason=" and ".join(why))
            message = "; ".join(m for m in (result.message, _auto_note(why)) if m)
            result = replace(scored_result(self.name, cost_model, model, choice.chosen.plan, stats, result.top_k,
                                           message), robust=choice)
        new_stats = replace(result.stats, wall_time_s=time.perf_counter() - start)
        return _replace_stats(result, new_stats)

    def fix_precision(self, options: dict[str, Any], value: str, cluster: ClusterSpec) -> dict[str, Any]:
        """``options`` with the precision of every layer set by ``value`` (``search``, ``fp8`` or a
        specs.precision value: SearchSpace.with_precision): a planner with a ``space`` option
        takes it into that space; one without plans in bf16 and refuses anything else."""
        defaults = getattr(self, "defaults", {})
        if "space" not in defaults:
            if value != "bf16":
                raise SpecError(f"{self.name}: precision", f"{value!r}: this planner plans in bf16 only")
            return options
        from planners.space import SearchSpace
        space = options.get("space", defaults["space"])
        space = SearchSpace.preset(space) if isinstance(space, str) else space
        return {**options, "space": space.with_precision(value, cluster.gpu)}

    @abstractmethod
    def _search(self, model: ModelSpec, cluster: ClusterSpec, budget: Budget, cost_model: CostModel,
                options: dict[str, Any]) -> PlanResult:
        """The search proper; ``stats.wall_time_s`` is filled in by ``plan``."""


def _uncovered(cost_model: CostModel, result: PlanResult) -> tuple[str, ...]:
    """Under objective=auto: what the nominal plan does beyond the measured data (none where the
    cost model has no constants to perturb, or there is no plan)."""
    if not result.feasible or not perturbable(cost_model):
        return ()
    return uncovered(result.plan, cost_model.constants.at_scale_ranks)


def _auto_note(why: tuple[str, ...]) -> str:
    """The message of a plan objective=auto chose robustly."""
    return f"robust objective: the nominal plan runs {' and '.join(why)}" if why else ""


def _with_stack(result: PlanResult, stack: SoftwareStack | None) -> PlanResult:
    """``result`` with its plans stating the software stack their times assume (none stated
    when the cost model assumes none)."""
    if stack is None or not result.feasible:
        return result
    return replace(result, plan=replace(result.plan, stack=stack),
                   top_k=tuple(replace(k, plan=replace(k.plan, stack=stack)) for k in result.top_k))


def overlapped(plan: Plan, stack: SoftwareStack | None) -> Plan | None:
    """``plan`` with TP communication overlap on, stating ``stack``; None where it cannot run it
    (Plan's own rules: a tp > 1 layer, Megatron-SP on each, a stack that runs it). The search
    planners' plans state it where their tables are built (ComboTables.plan), as plan_cost must
    see it; the grid baselines and the uniform targets turn it on here."""
    try:
        return replace(plan, tp_comm_overlap=True, stack=stack)
    except SpecError:
        return None


def _replace_stats(result: PlanResult, stats: SearchStats) -> PlanResult:
    from dataclasses import replace
    return replace(result, stats=stats)


def pop_options(options: dict[str, Any], allowed: dict[str, Any], planner: str) -> dict[str, Any]:
    """``allowed`` defaults overridden by ``options``; unknown keys are a one-line error."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise SpecError("options", f"{planner} does not take {', '.join(unknown)}; "
                        f"it takes {', '.join(sorted(allowed)) or 'none'}")
    return {**allowed, **options}
