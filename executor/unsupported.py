"""What a Plan may say that this executor does not run: refused in one line, never dropped."""
from __future__ import annotations

from executor.model import is_tied
from executor.parallel.vocab import refuse_vocab
from specs import ModelSpec, Plan


def refuse_unsupported(plan: Plan, model: ModelSpec) -> None:
    """SpecError naming the first field the executor cannot honour for ``model``."""
    refuse_vocab(plan, model, is_tied(model))
