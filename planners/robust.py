"""The robust objective: among a search's top plans and each perturbation scenario's own best
plan, the one whose worst regret over the nominal model and the scenarios is least.

Regret of plan p in scenario s: t_s(p) / min_q t_s(q) - 1, with t the iteration time per sample
(plans may differ in global batch) and q over every candidate, so each scenario's own optimum
(re-planned under it) sets that scenario's zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from cost_models import CostModel
from cost_models.scenarios import SCENARIOS, perturbed, scenario_names
from specs import ModelSpec, Plan, SpecError

OBJECTIVES = ("nominal", "robust", "auto")
"""nominal: the least plan_cost time; robust: the least worst regret; auto: robust where the
nominal plan leaves what the measured data covers (cost_models/coverage.py), else nominal."""
NOMINAL = "nominal"
"""The name of the unperturbed model among the scenarios."""


@dataclass(frozen=True, kw_only=True)
class RobustScore:
    """One candidate plan under the nominal model and every scenario (in RobustChoice's order)."""

    plan: Plan
    iteration_time_s: tuple[float, ...]
    regret: tuple[float, ...]
    """Relative regret per scenario, >= 0."""

    @property
    def regret_max(self) -> float:
        return max(self.regret)

    @property
    def worst_time_s(self) -> float:
        """The plan's iteration time under its worst scenario."""
        return max(self.iteration_time_s)


@dataclass(frozen=True, kw_only=True)
class RobustChoice:
    """What the robust objective chose, beside the nominal objective's plan."""

    scenarios: tuple[str, ...]
    """'nominal', then the perturbation scenarios' names."""
    chosen: RobustScore
    nominal: RobustScore
    """The plan the nominal objective returns (the same plan as chosen when robust agrees)."""
    candidates: int
    """Distinct plans compared."""
    reason: str = ""
    """Why the robust objective was applied under objective=auto (what the nominal plan runs
    beyond the measured data); empty when robust was asked for."""

    @property
    def differs(self) -> bool:
        return self.chosen.plan != self.nominal.plan


def objective(value: object) -> str:
    """The ``objective`` option, checked."""
    if value not in OBJECTIVES:
        raise SpecError("objective", f"must be one of {', '.join(OBJECTIVES)}, got {value!r}")
    return str(value)


REGRET_TOL = 1e-9
"""Regrets below this are 0 (plans of the same time differ by rounding only)."""
CHOICE_TOL = 1e-3
"""Worst regrets within 0.1% of the least count as equal: a difference that small is far inside
the cost model's error band, so among them the nominal time decides."""


def regrets(times: Sequence[Sequence[float]]) -> list[list[float]]:
    """``times[p][s]`` (per-sample times of plan p in scenario s) -> regret[p][s] =
    times[p][s] / min_q times[q][s] - 1 (below REGRET_TOL: 0)."""
    if not times:
        return []
    best = [min(row[s] for row in times) for s in range(len(times[0]))]
    return [[r if r > REGRET_TOL else 0.0 for r in (t / b - 1.0 for t, b in zip(row, best))] for row in times]


def robust_index(regret: Sequence[Sequence[float]]) -> int:
    """The plan with the least worst regret; among plans within CHOICE_TOL of it, the lowest
    nominal (first) regret, then the earliest plan (the nominal objective's plan comes first)."""
    least = min(max(row) for row in regret)
    near = [p for p, row in enumerate(regret) if max(row) <= least + CHOICE_TOL]
    return min(near, key=lambda p: (regret[p][0], p))


def choose(model: ModelSpec, plans: Sequence[Plan], models: Sequence[CostModel],
           names: Sequence[str]) -> RobustChoice:
    """Score every distinct plan (``plans[0]``: the nominal objective's) under every model
    (``models[0]``: the nominal one, named by ``names``) and choose by least worst regret."""
    distinct = list(dict.fromkeys(plans))
    costs = [[m.plan_cost(model, p) for m in models] for p in distinct]
    times = [tuple(c.iteration_time_s for c in row) for row in costs]
    regret = regrets([[t / p.global_batch for t in row] for p, row in zip(distinct, times)])
    scores = [RobustScore(plan=p, iteration_time_s=t, regret=tuple(r)) for p, t, r in zip(distinct, times, regret)]
    return RobustChoice(scenarios=tuple(names), chosen=scores[robust_index(regret)], nominal=scores[0],
                        candidates=len(distinct))


def robust_plans(search: Callable[[CostModel], tuple[Plan, ...]], model: ModelSpec, cost_model: CostModel,
                 nominal: tuple[Plan, ...], scenarios: str | tuple[str, ...] | None,
                 wrap: Callable[[CostModel], CostModel] = lambda m: m) -> RobustChoice:
    """The robust choice among ``nominal`` (the nominal search's best plan first, then its top
    plans) and, per scenario, the plans ``search`` returns under ``cost_model`` perturbed by it
    (``wrap``ped, e.g. in the extra memory models)."""
    names = scenario_names(scenarios)
    models = [wrap(cost_model)] + [wrap(perturbed(cost_model, SCENARIOS[n])) for n in names]
    plans = list(nominal)
    for m in models[1:]:
        plans += search(m)
    return choose(model, plans, models, (NOMINAL, *names))
