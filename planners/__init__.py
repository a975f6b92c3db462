"""Planners: choose a Plan for a model on a cluster under a memory budget (Galvatron DP, ILP, CP-SAT, baselines)."""
from planners.base import Budget, Planner, PlanResult, RankedPlan, SearchStats
from planners.registry import CLUSTER_PLANNERS, DEFAULT_PLANNERS, available, get, plan, register
from planners.space import SearchSpace

__all__ = ["Budget", "Planner", "PlanResult", "RankedPlan", "SearchStats", "SearchSpace", "CLUSTER_PLANNERS", "DEFAULT_PLANNERS",
           "available", "get", "plan", "register"]
