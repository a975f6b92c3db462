"""Stated limits on inputs, each with its reason, checked before any work starts.

A value past a limit is a SpecError naming the field, the value and the limit, so that a
typo (``num_layers: 10**12``) fails in milliseconds instead of growing memory without end.
"""
from __future__ import annotations

import math

from specs.errors import SpecError

MAX_FILE_BYTES = 16 * 1024**2
"""Input files (model, cluster, plan, calibration, profile): the largest we ship is 11 KB and a
profile of a 10,000-layer model stays under 2 MB; 16 MiB leaves room and bounds parse time."""
MAX_JSON_DEPTH = 32
"""Nesting of a JSON input: our deepest format (a profile) nests 4 levels; 32 keeps the parser
far from Python's recursion limit."""
MAX_INT_DIGITS = 30
"""Digits of an integer in an input file: every count we read fits in 20 digits; a longer
integer is a typo, and Python refuses past 4,300 digits anyway."""
MAX_LAYERS = 10_000
"""Transformer blocks in a model: the largest published models have ~130 (GPT-1T in the zoo:
128); planners keep per-layer tables, so 10,000 bounds their memory and time."""
MAX_NODES = 4_096
"""Nodes of a cluster: the largest published training runs use ~2,000-4,000 nodes."""
MAX_GPUS_PER_NODE = 64
"""GPUs in one node: today's servers hold 8 (16 in a few); a rack-scale NVLink domain is nodes of
one scale-up domain (MAX_SCALE_UP_DOMAIN_GPUS), not one node."""
MAX_SCALE_UP_DOMAIN_GPUS = 576
"""GPUs of one NVLink domain: fifth-generation NVLink switches connect up to 576 GPUs (NVIDIA's
NVLink/NVSwitch page); GB200 NVL72 racks are 72."""
MAX_GPUS = 65_536
"""World size: 4x the largest published runs (16,384 H100s for Llama 3 405B). The simulator
plays one rank per group of symmetric ranks (every rank with --full, which this bounds): a
data-parallel iteration of tiny-gpt over 65,536 GPUs takes about 40 s of one core's CPU time
(its collectives' work grows linearly with the ranks of a group)."""
MAX_MICRO_BATCHES = 4_096
"""Micro-batches of one iteration: the simulator and the executor play each one per stage;
pipelines use 4-8x pp of them (a few hundred at most)."""
MAX_GLOBAL_BATCH = 1 << 24
"""Samples per iteration: 16 M samples is ~4,000 times the batch of GPT-3 (3.2 M tokens at 2,048)."""
MAX_UNIT_TIME_S = 1e6
"""Time of one unit of work made from one input number (moving 1 GB over a link or through
memory, one hop's latency, 1 TFLOP at peak, one profiled sample or million parameters): over
11 days is a typo or a number like 5e-324. Every count of units is bounded by the limits here
(below 1e30), so every time the models add up stays finite."""
MAX_WIDTH = 1 << 24
"""Any width or length of a layer (hidden, heads, FFN, sequence, vocabulary, image): 16 M is
~200x the largest published values (vocabularies of 256 K, contexts of 1 M tokens)."""
MAX_EXPERTS = 1 << 16
"""Routed experts of one MoE layer: published models have up to 384; expert parallelism places
each expert on a rank, and 65,536 is MAX_GPUS."""

COUNT_LIMITS: dict[str, tuple[int, str]] = {
    "num_layers": (MAX_LAYERS, "planners keep per-layer tables"),
    "num_hidden_layers": (MAX_LAYERS, "planners keep per-layer tables"),
    "num_decoder_layers": (MAX_LAYERS, "planners keep per-layer tables"),
    "num_experts": (MAX_EXPERTS, "one expert per rank at most MAX_GPUS"),
    "num_local_experts": (MAX_EXPERTS, "one expert per rank at most MAX_GPUS"),
    "n_routed_experts": (MAX_EXPERTS, "one expert per rank at most MAX_GPUS"),
    "num_shared_experts": (MAX_EXPERTS, "one expert per rank at most MAX_GPUS"),
    "n_shared_experts": (MAX_EXPERTS, "one expert per rank at most MAX_GPUS"),
    "top_k": (MAX_EXPERTS, "at most the experts"),
    "num_experts_per_tok": (MAX_EXPERTS, "at most the experts"),
    "expert_groups": (MAX_EXPERTS, "at most the experts"),
    "n_group": (MAX_EXPERTS, "at most the experts"),
    "groups_per_token": (MAX_EXPERTS, "at most the experts"),
    "topk_group": (MAX_EXPERTS, "at most the experts"),
}
"""The one table of limits on integer fields (of model files, Hugging Face configs and the
layer dataclasses), by field name; every other width, length or count is at most MAX_WIDTH."""


def limit_of(field: str) -> tuple[int, str]:
    """(limit, reason) for an integer field named ``field`` (its last dotted part)."""
    return COUNT_LIMITS.get(field.rsplit(".", 1)[-1], (MAX_WIDTH, "200x the largest published widths"))


def within_limit(value: int, field: str) -> int:
    """``value`` unless it exceeds the table's limit for ``field`` (COUNT_LIMITS, else MAX_WIDTH)."""
    limit, reason = limit_of(field)
    return at_most(value, limit, field, reason)


def check_int_fields(obj: object, prefix: str = "") -> None:
    """Every integer field of the dataclass ``obj`` within its limit (``within_limit``)."""
    import dataclasses
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            within_limit(value, prefix + f.name)


def at_most(value: int, limit: int, field: str, reason: str) -> int:
    """``value`` unless it exceeds ``limit``; then a SpecError naming the field and the limit."""
    if value > limit:
        raise SpecError(field, f"{value} exceeds the limit of {limit:,} ({reason})")
    return value


def unit_time(seconds: float, field: str, value: float, work: str) -> float:
    """``seconds``, the time ``field`` = ``value`` gives to one unit of ``work``, unless it is not
    finite, negative or past MAX_UNIT_TIME_S; then a SpecError naming the field and that time."""
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_UNIT_TIME_S):
        raise SpecError(field, f"{value!r} makes {work} take {seconds:.3g} s (must be finite, >= 0 and "
                               f"at most {MAX_UNIT_TIME_S:.0e} s per unit of work)")
    return seconds


def made_time(seconds: float, field: str, what: str) -> float:
    """``seconds``, a time the models made (``what``), unless it is not finite or negative: the
    last guard behind unit_time, for a number no input check saw (a SpecError, never a record
    with an infinite time or a NaN share)."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise SpecError(field, f"{what} came out as {seconds!r} s: an input number (cluster, calibration "
                               "or profile) makes times that are not finite")
    return seconds
