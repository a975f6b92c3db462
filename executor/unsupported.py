"""What a Plan may say that this executor does not run yet: refused in one line, never dropped."""
from __future__ import annotations

from specs import Plan, SpecError


def refuse_unsupported(plan: Plan) -> None:
    """SpecError naming the first field the executor cannot honour (Ulysses, interleaved
    1F1B, the vocabulary's sequence parallelism and ZeRO-3)."""
    for i, s in enumerate(plan.layers):
        if s.ulysses:
            raise SpecError(f"layer {i}", "sp ulysses is planned and simulated but the executor does not run it yet")
    if plan.virtual_stages > 1:
        raise SpecError("virtual_stages", f"virtual_stages {plan.virtual_stages}: the executor does not run "
                        "interleaved 1F1B yet")
    if plan.vocab_sp != "none":
        raise SpecError("vocab_sp", f"vocab_sp {plan.vocab_sp}: the executor does not shard the vocabulary yet")
    if plan.vocab_zero3:
        raise SpecError("vocab_zero3", "vocab_zero3: the executor does not shard the vocabulary yet")
