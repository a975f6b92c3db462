"""Cost models: time and memory of layers, collectives and plans, behind one interface."""
from cost_models.base import (COLLECTIVES, GIB, CostModel, LayerTime, MemoryBreakdown, PlanCost,
                              in_flight, pipeline_time, stage_in_flight)
from cost_models.charged import ChargedCollective, charged_collectives, charged_dp_collectives, expected_collectives
from cost_models.registry import available, get, register

__all__ = ["COLLECTIVES", "GIB", "CostModel", "LayerTime", "MemoryBreakdown", "PlanCost",
           "in_flight", "pipeline_time", "stage_in_flight", "available", "get", "register", "ChargedCollective", "charged_dp_collectives",
           "charged_collectives", "expected_collectives"]
