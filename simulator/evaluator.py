"""The simulator as a plan evaluator for ``python -m planners.compare --evaluate sim``; registered
through the ``hybridpar.evaluators`` entry point (pyproject.toml), so planners never import it."""
from __future__ import annotations

from simulator.engine import simulate
from simulator.result import SimResult
from specs import ClusterSpec, ModelSpec, Plan


class SimulatorEvaluator:
    """runners.evaluators.Evaluator, by shape."""

    name = "sim"
    help = "re-score each plan with simulator.simulate (the discrete-event model)"

    def evaluate(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> SimResult:
        return simulate(model, cluster, plan)
