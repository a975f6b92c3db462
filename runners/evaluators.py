"""Re-scoring a chosen plan with another predictor (``compare --evaluate NAME``): the interface
here; implementations live in packages beside or above planners (the simulator's is
``simulator.evaluator``) and join through the ``hybridpar.evaluators`` entry-point group."""
from __future__ import annotations

from typing import ClassVar, Protocol, Sequence

from specs import ClusterSpec, ModelSpec, Plan
from specs.registry import Registry


class Evaluation(Protocol):
    """What an evaluator says about one plan (simulator.SimResult is one)."""

    iteration_time_s: float
    throughput_samples_per_s: float
    peak_memory_bytes: Sequence[float]
    """Per simulated rank."""
    oom: object
    """None when the plan fits, else what ran out."""


class Evaluator(Protocol):
    """Structural, so an implementation need not import planners (the simulator must not)."""

    name: ClassVar[str]
    help: ClassVar[str]
    """One line for ``--help``."""

    def evaluate(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Evaluation:
        """Predict one training iteration of ``plan``."""


EVALUATORS: Registry[type] = Registry("evaluate", [], group="hybridpar.evaluators")
"""Empty here: planners cannot name the simulator; the entry point in pyproject.toml does."""
