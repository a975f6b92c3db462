"""What a Plan may say that this executor does not run yet: refused in one line, never dropped."""
from __future__ import annotations

from specs import Plan, SpecError


def refuse_unsupported(plan: Plan) -> None:
    """SpecError naming the first field the executor cannot honour (Ulysses, interleaved 1F1B)."""
    for i, s in enumerate(plan.layers):
        if s.ulysses:
            raise SpecError(f"layer {i}", "sp ulysses is planned and simulated but the executor does not run it yet")
    if plan.virtual_stages > 1:
        raise SpecError("virtual_stages", f"virtual_stages {plan.virtual_stages}: the executor does not run "
                        "interleaved 1F1B yet")



def vocab_notes(plan: Plan) -> list[str]:
    """The vocabulary layout the executor does not reproduce: it runs the embedding and head
    replicated on each stage (the same numbers; only memory and time differ), and says so."""
    notes = []
    if plan.vocab_tp > 1:
        notes.append("vocab_tp ignored: embedding and head are replicated on the TP group")
    if plan.vocab_sp != "none":
        notes.append(f"vocab_sp {plan.vocab_sp} ignored: the embedding and head see whole sequences")
    if plan.vocab_zero3:
        notes.append("vocab_zero3 ignored: embedding and head states are not sharded")
    return notes
