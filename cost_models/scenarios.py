"""Perturbation scenarios of the analytical model's uncertain constants (bandwidths, network and
GEMM efficiency, collectives at a scale no measured run covers): the robust objective's table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from cost_models.base import CostModel
from cost_models.constants import AnalyticalConstants
from specs import SpecError


@dataclass(frozen=True)
class Scenario:
    """One perturbation: constants scaled from the model's values and/or capped."""

    name: str
    """Short name, used in records and tables."""
    description: str
    """What it assumes, in words."""
    scale: tuple[tuple[str, float], ...] = ()
    """(constant, factor): the model's value times factor."""
    cap: tuple[tuple[str, float], ...] = ()
    """(constant, value): the model's value, at most this."""

    def __post_init__(self) -> None:
        for constant, factor in self.scale + self.cap:
            if not 0 < factor:
                raise SpecError(f"scenario.{self.name}", f"{constant} factor or cap must be > 0, got {factor!r}")

    def apply(self, constants: AnalyticalConstants) -> AnalyticalConstants:
        """``constants`` perturbed (the constants' own rules refuse what cannot hold)."""
        values: dict[str, float] = {c: getattr(constants, c) * f for c, f in self.scale}
        for c, v in self.cap:
            values[c] = min(values.get(c, getattr(constants, c)), v)
        return constants.with_values(values)


LINKS = ("bus_efficiency", "network_efficiency", "p2p_efficiency")
SCENARIOS: Mapping[str, Scenario] = {s.name: s for s in (
    Scenario("bw-20%", "every link's bandwidth -20% (NVLink, PCIe, network, pipeline sends)",
             scale=tuple((c, 0.8) for c in LINKS)),
    Scenario("inter-node-20%", "inter-node bandwidth -20%", scale=(("network_efficiency", 0.8),)),
    Scenario("net-eff-0.6", "network efficiency at most 0.6 (default 0.96: busbw on congested fabrics)",
             cap=(("network_efficiency", 0.6),)),
    Scenario("gemm-10%", "GEMM efficiency -10%", scale=(("gemm_efficiency_max", 0.9),)),
    Scenario("at-scale", "collectives over groups of more ranks than data/ measures (at_scale_ranks) at 0.7 of the "
             "modelled bandwidth (an assumption: no measured run says how much is lost)",
             cap=(("at_scale_efficiency", 0.7),)),
)}
"""The default scenarios, by name."""


def scenario_names(names: str | tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Names given as a tuple or a comma-separated string, checked (None: every scenario)."""
    if names is None:
        return tuple(SCENARIOS)
    items = tuple(n for n in (names.split(",") if isinstance(names, str) else names) if n)
    for n in items:
        if n not in SCENARIOS:
            raise SpecError("scenarios", f"unknown {n!r}; choose from {', '.join(SCENARIOS)}")
    if not items:
        raise SpecError("scenarios", "name at least one scenario")
    return items


def perturbable(cost_model: CostModel) -> bool:
    """Whether ``cost_model`` has named constants to perturb (the analytical model)."""
    return isinstance(getattr(cost_model, "constants", None), AnalyticalConstants) and \
        hasattr(cost_model, "with_constants")


def perturbed(cost_model: CostModel, scenario: Scenario) -> CostModel:
    """``cost_model`` under ``scenario``: a model with named constants (the analytical one) only."""
    if not perturbable(cost_model):
        raise SpecError("objective", f"robust planning perturbs the analytical model's constants; the "
                        f"{cost_model.name} cost model has none (use --cost-model analytical)")
    return cost_model.with_constants(scenario.apply(cost_model.constants))
