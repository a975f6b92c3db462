"""Read Galvatron's own profile files (computation, memory, all-reduce, p2p, overlap JSONs) as they
are, and turn them into our Profile plus Galvatron's measured embedding/head memory tables.

Units there: times in ms, memory in MiB, bandwidths in GB/s; parameter_size is fp32 MiB.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from specs.profile_format import LayerProfile, LayerSignature, Profile, ProfileError, VocabProfile
from specs import ClusterSpec, LayerSpec, SpecError
from specs.errors import read_json
from specs.schema import check_galvatron_file
from specs.units import MIB

FP32_BYTES = 4
PROFILED_DTYPE_BYTES = 2
"""Galvatron profiles in bf16/fp16; our parameter_bytes are in the profiled dtype."""
PROFILE_FILES = ("computation_profiling_*.json", "memory_profiling_*.json", "allreduce_bandwidth_*.json",
                 "p2p_bandwidth_*.json", "overlap_coefficient*.json", "sp_time_*.json")
"""Galvatron's profile files (tables of numbers); other files in the folder are not read here."""
BACKWARD_OVER_FORWARD = 2.0
"""Galvatron's rule: backward takes twice the forward."""


@dataclass(frozen=True)
class GalvatronProfile:
    """What Galvatron's files hold, in our terms."""

    profile: Profile
    seq_len: int
    """Sequence length the files were measured at."""
    vocab_memory_mib: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """other_memory tables: {'pp_off'|'first'|'last': {'model_states'|'activation': {vtp: MiB}}}."""


def _read(path: Path) -> dict[str, Any]:
    """A profile file checked against its structure (specs.schema.check_galvatron_file)."""
    kind = next(p.split("*")[0].rstrip("_") for p in PROFILE_FILES if path.match(p))
    try:
        raw = read_json(path)
        check_galvatron_file(kind, raw)
        return raw
    except SpecError as err:
        raise ProfileError(err.field, err.message, err.source or str(path)) from None


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if not found:
        raise ProfileError("galvatron_dir", f"no file matching {pattern!r} in {folder}")
    return found[0]


def _layer_forward_ms(computation: dict[str, float]) -> tuple[dict[int, float], dict[int, float], int]:
    """Per-layer forward ms by batch (difference of the runs with two layer counts), the rest
    (embedding + head) by batch, and the sequence length."""
    runs: dict[tuple[int, int], float] = {}
    seq = 0
    for key, ms in computation.items():
        m = re.fullmatch(r"layernum\[(\d+)\]_bsz(\d+)_seq(\d+)", key)
        if m:
            runs[(int(m.group(1)), int(m.group(2)))] = float(ms)
            seq = int(m.group(3))
    counts = sorted({n for n, _ in runs})
    if len(counts) < 2:
        raise ProfileError("computation_profiling", "needs runs with two layer counts (layernum[a], layernum[b])")
    low, high = counts[0], counts[-1]
    layer, other = {}, {}
    for (n, b), ms in runs.items():
        if n == high and (low, b) in runs:
            per_layer = (ms - runs[(low, b)]) / (high - low)
            if per_layer <= 0:  # the difference of the two runs is the layers' time
                raise ProfileError(f"computation_profiling.layernum[{high}]_bsz{b}",
                                   f"{ms:g} ms is not more than layernum[{low}]'s {runs[(low, b)]:g} ms at batch "
                                   f"{b}: a layer would take {per_layer:.3g} ms")
            layer[b] = per_layer
            other[b] = max(runs[(low, b)] - low * per_layer, 1e-6)
    return dict(sorted(layer.items())), dict(sorted(other.items())), seq


def read_galvatron_dir(folder: str | Path, cluster: ClusterSpec, layer: LayerSpec) -> GalvatronProfile:
    """Galvatron's files in ``folder`` for a model whose (single) layer type is ``layer``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ProfileError("galvatron_dir", f"not a folder: {folder}")
    for pattern in PROFILE_FILES:  # every profile file valid, also those this cluster skips
        for path in sorted(folder.glob(pattern)):
            _read(path)
    computation = _one(folder, "computation_profiling_*.json")
    try:
        fwd, other, seq = _layer_forward_ms(_read(computation))
    except SpecError as err:
        raise err.with_source(str(computation)) from None
    memory = _read(_one(folder, "memory_profiling_*.json"))
    layer_mem = _pick_seq(memory.get("layertype_0_sp") or memory.get("layertype_0"), "layertype_0_sp", seq)
    params = float(layer_mem["parameter_size"]) * MIB / FP32_BYTES
    act = {("ckpt" if k == "checkpoint" else str(k)): float(v) * MIB
           for k, v in layer_mem["tp_activation_per_bsz_dict"].items()}
    signature = replace(LayerSignature.of(layer), seq_len=seq)  # measured at the files' length
    layer_profile = LayerProfile(signature=signature, forward_ms=fwd,
                                 backward_ms={b: BACKWARD_OVER_FORWARD * t for b, t in fwd.items()},
                                 parameter_bytes=params * PROFILED_DTYPE_BYTES, activation_bytes_per_sample=act)
    vocab = VocabProfile(forward_ms=other, backward_ms={b: BACKWARD_OVER_FORWARD * t for b, t in other.items()},
                         parameter_bytes=0.0)
    nodes = cluster.nodes
    allreduce = _read(_bandwidth_file(folder, "allreduce", nodes, cluster.gpus_per_node))
    p2p = _read(_bandwidth_file(folder, "p2p", nodes, cluster.gpus_per_node))
    overlap = _read(_one(folder, "overlap_coefficient*.json")).get("overlap_coe", 1.0)
    measured_sp = "layertype_0_sp" in memory  # Galvatron's *_sp tables: layers measured with Megatron-SP
    profile = Profile(hardware={"source": f"galvatron:{folder}", "dtype": "bf16", "sequence_parallel": measured_sp},
                      layers=(layer_profile,), vocab=vocab,
                      allreduce_gbytes_per_s=_allreduce_table(allreduce),
                      p2p_gbytes_per_s={k.removeprefix("pp_size_"): float(v) for k, v in p2p.items()},
                      overlap_coefficient=max(1.0, float(overlap)))
    vocab_mem = {name: _pick_seq(memory.get(f"other_memory_pp_{key}_sp") or memory.get(f"other_memory_pp_{key}"),
                                 f"other_memory_pp_{key}", seq)
                 for name, key in (("pp_off", "off"), ("first", "on_first"), ("last", "on_last"))}
    return GalvatronProfile(profile=profile, seq_len=seq, vocab_memory_mib=vocab_mem)


def _pick_seq(table: Any, name: str, seq: int) -> dict:
    if not isinstance(table, dict) or not table:
        raise ProfileError(name, "missing from the memory profile")
    return table.get(str(seq)) or next(iter(table.values()))


def _bandwidth_file(folder: Path, kind: str, nodes: int, gpus_per_node: int) -> Path:
    """The file for this many nodes, else the one for the fewest nodes."""
    exact = folder / f"{kind}_bandwidth_{nodes}nodes_{gpus_per_node}gpus_per_node.json"
    return exact if exact.exists() else _one(folder, f"{kind}_bandwidth_*nodes_*.json")


def _allreduce_table(raw: dict[str, float]) -> dict[str, float]:
    out = {}
    for key, value in raw.items():
        m = re.fullmatch(r"allreduce_size_(\d+)_consec_([01])", key)
        if m and int(m.group(1)) >= 2:
            out[f"{m.group(1)}_{'consec' if m.group(2) == '1' else 'strided'}"] = float(value)
    return out


def linear_fit(table: dict[int, float]) -> tuple[float, float]:
    """(slope, intercept) of ms = slope * batch + intercept (slope only when one point)."""
    batches = np.array(sorted(table), dtype=float)
    times = np.array([table[int(b)] for b in batches])
    if len(batches) == 1:
        return float(times[0] / batches[0]), 0.0
    slope, intercept = np.polyfit(batches, times, 1)
    return float(slope), float(max(intercept, 0.0))
