"""How layers are laid out over the model chunks of a pipeline schedule (Megatron's layout)."""
from __future__ import annotations

from specs.errors import SpecError
from specs.schedules import Schedule, schedule_entry


def chunk_layout(num_layers: int, pp: int, virtual_stages: int, schedule: str = Schedule.INTERLEAVED_1F1B
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Megatron's layout of ``num_layers`` over pp * v chunks: (stage_layers, chunk_layers).
    Equal chunks when they divide; else the embedding and the loss each count as one layer
    (--account-for-embedding/loss-in-pipeline-split), so the first and last chunks take one
    layer fewer, the remainder going to the chunks after the first: 126 layers on 32 chunks
    are 3 + 4 x 30 + 3 (too few layers for that: the plain split, remainder after the first).
    Two layers fewer than chunks: one layer a chunk, the first holding only the embedding and
    the last only the loss (0 + 1 x 126 + 0 on 128 chunks, Llama 3 405B's layout; not under a
    split backward, whose first chunk runs its whole backward at W). SpecError when a chunk
    would be left without a layer otherwise."""
    chunks = pp * virtual_stages
    entry = schedule_entry(schedule)
    if num_layers == chunks - 2 and virtual_stages > 1 and not entry.splits_backward:
        counts = [0] + [1] * num_layers + [0]
        return stage_sums(counts, pp, virtual_stages, schedule), tuple(counts)
    if num_layers < chunks:
        raise SpecError("virtual_stages", f"{num_layers} layers leave a chunk empty on pp({pp}) * "
                        f"virtual_stages({virtual_stages}) = {chunks} chunks")
    for ends in (0,) if num_layers % chunks == 0 else (1, 0):
        base, extra = divmod(num_layers + 2 * ends, chunks)
        counts = [base + (1 if 0 < j <= extra else 0) for j in range(chunks)]
        counts[0] -= ends
        counts[-1] -= ends
        if min(counts) >= 1:
            break
    return stage_sums(counts, pp, virtual_stages, schedule), tuple(counts)


def stage_sums(chunk_layers, pp: int, virtual_stages: int, schedule: str) -> tuple[int, ...]:
    """Each stage's layers: the sum of the chunks (``chunk_layers``, in model order) ``schedule``
    places on it (round-robin, or V-shaped)."""
    entry = schedule_entry(schedule)
    return tuple(sum(chunk_layers[j] for j in entry.stage_chunks(k, pp, virtual_stages)) for k in range(pp))
