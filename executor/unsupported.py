"""What a Plan may say that this executor does not run: refused in one line, never dropped."""
from __future__ import annotations

from executor.model import is_tied
from executor.parallel.vocab import refuse_vocab
from specs import ModelSpec, Plan, SpecError


def refuse_unsupported(plan: Plan, model: ModelSpec) -> None:
    """SpecError naming the first field the executor cannot honour for ``model``."""
    for i, (s, spec) in enumerate(zip(plan.layers, model.layers)):
        if s.ulysses > 1 and spec.moe is not None:
            raise SpecError(f"layer {i}", f"sp ulysses on a MoE layer is not run: the experts would see "
                            f"sequence chunks of degree {s.ulysses} that their groups do not sum over")
    refuse_vocab(plan, model, is_tied(model))
