"""Stated limits on inputs, each with its reason, checked before any work starts.

A value past a limit is a SpecError naming the field, the value and the limit, so that a
typo (``num_layers: 10**12``) fails in milliseconds instead of growing memory without end.
"""
from __future__ import annotations

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
"""World size: 4x the largest published runs (16,384 H100s for Llama 3 405B); the simulator
plays every rank with --full, so the world size bounds its event count."""
MAX_MICRO_BATCHES = 4_096
"""Micro-batches of one iteration: the simulator and the executor play each one per stage;
pipelines use 4-8x pp of them (a few hundred at most)."""
MAX_GLOBAL_BATCH = 1 << 24
"""Samples per iteration: 16 M samples is ~4,000 times the batch of GPT-3 (3.2 M tokens at 2,048)."""
MAX_WIDTH = 1 << 24
"""Any width or length of a layer (hidden, heads, FFN, sequence, vocabulary, image): 16 M is
~200x the largest published values (vocabularies of 256 K, contexts of 1 M tokens)."""


def at_most(value: int, limit: int, field: str, reason: str) -> int:
    """``value`` unless it exceeds ``limit``; then a SpecError naming the field and the limit."""
    if value > limit:
        raise SpecError(field, f"{value} exceeds the limit of {limit:,} ({reason})")
    return value
