"""Our profile file ("hybridpar-profile" v1, docs/profile_format.md): reader, writer, validation.

Shared by the executor (its profiler writes it with ``save_profile``) and the ``profiled`` cost
model (reads it with ``load_profile``), so it lives in specs. Errors are one line each.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from specs.errors import SpecError, load_json_with
from specs.files import atomic_write_json
from specs.model import LayerSpec
from specs.schema import ProfileFile, check
from specs.limits import unit_time

FORMAT = "hybridpar-profile"
VERSION = 1
_GROUP_KEY = re.compile(r"^(\d+)_(consec|strided)$")
COLLECTIVE_KINDS = ("all_gather", "reduce_scatter")
"""Collectives a profile may measure beside the all-reduce (Profile.collective_gbytes_per_s)."""


class ProfileError(SpecError):
    """A malformed profile file or object."""


def _number(value: Any, where: str, minimum: float = 0.0, strict: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if not ok or value == float("inf") or value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ProfileError(where, f"must be a finite number {bound}, got {value!r}")
    _unit_time(float(value), where)
    return float(value)


def _unit_time(value: float, where: str) -> None:
    """The time a profile number gives to one unit of work is finite and bounded (specs.limits)."""
    if "gbytes_per_s" in where:
        unit_time(1 / value if value else 0.0, where, value, "moving 1 GB")
    elif "_ms" in where:
        unit_time(value * 1e-3, where, value, "one unit (a sample, or a million parameters)")
    elif "_us" in where or where == "overlap_coefficient":
        unit_time(value * (1e-6 if "_us" in where else 1.0), where, value, "one collective's fixed cost"
                  if "_us" in where else "1 s of overlapped work")


def _check_group_keys(table: Mapping[str, float], where: str) -> None:
    for key in table:
        if not _GROUP_KEY.match(key) or int(key.split("_")[0]) < 2:
            raise ProfileError(where, f"key must look like '4_consec' or '4_strided' (group size >= 2), got {key!r}")


def _positive_key(key: Any, where: str) -> int:
    text = str(key)
    if not text.isdigit() or int(text) <= 0:
        raise ProfileError(where, f"key must be a positive integer, got {key!r}")
    return int(text)


def _table(raw: Any, where: str, allow_empty: bool = False) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise ProfileError(where, f"must be an object of numbers, got {raw!r}")
    if not raw and not allow_empty:
        raise ProfileError(where, "must not be empty")
    return {str(k): _number(v, f"{where}[{k!r}]") for k, v in raw.items()}


def _batch_table(raw: Any, where: str) -> dict[int, float]:
    """{batch size: ms} with positive integer keys."""
    table = _table(raw, where)
    return {_positive_key(k, where): v for k, v in sorted(table.items(), key=lambda kv: int(kv[0])
                                                          if kv[0].isdigit() else -1)}


def _degree_tables(raw: Any, where: str) -> dict[int, dict[int, float]]:
    """{degree > 1 (tp, or dp of a ZeRO-3 table): {batch size: ms}}."""
    if not isinstance(raw, Mapping):
        raise ProfileError(where, f"must be an object, got {raw!r}")
    out = {}
    for key, table in raw.items():
        degree = _positive_key(key, where)
        if degree < 2:
            raise ProfileError(where, f"degree keys must be >= 2 (degree 1 is forward_ms/backward_ms), got {key!r}")
        out[degree] = _batch_table(table, f"{where}.{key}")
    return dict(sorted(out.items()))


@dataclass(frozen=True, kw_only=True)
class LayerSignature:
    """What identifies a layer type: its kind and shape (matches a LayerSpec)."""

    kind: str
    """LayerSpec.kind, e.g. 'gpt' or 'llama'."""
    hidden_size: int
    """Model width h."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (equal to num_heads without grouped-query attention)."""
    ffn_hidden_size: int
    """MLP inner width."""
    seq_len: int
    """Tokens per sample."""

    @classmethod
    def of(cls, layer: LayerSpec) -> "LayerSignature":
        return cls(kind=layer.kind, hidden_size=layer.hidden_size, num_heads=layer.num_heads,
                   num_kv_heads=layer.kv_heads, ffn_hidden_size=layer.ffn_hidden_size,
                   seq_len=layer.seq_len)

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> "LayerSignature":
        if not isinstance(raw, Mapping):
            raise ProfileError(where, f"must be an object, got {raw!r}")
        if not isinstance(raw.get("kind"), str):
            raise ProfileError(f"{where}.kind", f"must be a string, got {raw.get('kind')!r}")
        ints = {}
        for key in ("hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "seq_len"):
            value = raw.get(key, raw.get("num_heads") if key == "num_kv_heads" else None)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ProfileError(f"{where}.{key}", f"must be a positive integer, got {value!r}")
            ints[key] = value
        return cls(kind=raw["kind"], **ints)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "hidden_size": self.hidden_size, "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "ffn_hidden_size": self.ffn_hidden_size,
                "seq_len": self.seq_len}


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """Measured time and memory of one layer type."""

    signature: LayerSignature
    """Which LayerSpec this entry describes."""
    forward_ms: dict[int, float]
    """Forward time of one micro-batch, ms, keyed by micro-batch size (tp 1)."""
    backward_ms: dict[int, float]
    """Backward time (without recomputation), ms, keyed by micro-batch size (tp 1)."""
    parameter_bytes: float
    """Parameters of the layer at tp 1 in the profiled dtype, bytes."""
    activation_bytes_per_sample: dict[str, float]
    """Activation bytes kept for backward per sample, keyed by tp degree ('1', '2', ...) and
    'ckpt' (checkpointed layer: its input only)."""
    tp_forward_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    """Optional: forward of the layer run tensor parallel as the executor runs it (its TP
    collectives included), ms, keyed by tp degree (> 1), then by micro-batch size."""
    tp_backward_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    """The same for the backward (without recomputation)."""
    sp_forward_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    """Optional: forward of the layer run tensor parallel with Megatron sequence parallelism as
    the executor runs it between two blocks of the same split (its input and output this
    rank's sequence chunk; its all-gathers and reduce-scatters included), ms, keyed by tp
    degree (> 1), then by micro-batch size."""
    sp_backward_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    """The same for the backward (without recomputation)."""
    sp_selective_backward_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    """The same backward with selective recomputation as the executor applies it (the re-run
    part of the forward included)."""
    zero3_forward_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    """Optional: forward of the layer run ZeRO-3 as the executor runs it (FSDP2, its parameter
    all-gather included), ms, keyed by dp degree (> 1), then by micro-batch size per rank."""
    zero3_backward_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    """The same for the backward (its all-gather and gradient reduce-scatter included)."""

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> "LayerProfile":
        if not isinstance(raw, Mapping):
            raise ProfileError(where, f"must be an object, got {raw!r}")
        act = _table(raw.get("activation_bytes_per_sample"), f"{where}.activation_bytes_per_sample")
        for key in act:
            if key != "ckpt":
                _positive_key(key, f"{where}.activation_bytes_per_sample")
        if not any(k != "ckpt" for k in act):
            raise ProfileError(f"{where}.activation_bytes_per_sample", "needs at least one tp degree key")
        return cls(signature=LayerSignature.from_dict(raw.get("signature"), f"{where}.signature"),
                   forward_ms=_batch_table(raw.get("forward_ms"), f"{where}.forward_ms"),
                   backward_ms=_batch_table(raw.get("backward_ms"), f"{where}.backward_ms"),
                   parameter_bytes=_number(raw.get("parameter_bytes"), f"{where}.parameter_bytes",
                                           strict=False),
                   activation_bytes_per_sample=act,
                   tp_forward_ms=_degree_tables(raw.get("tp_forward_ms", {}), f"{where}.tp_forward_ms"),
                   tp_backward_ms=_degree_tables(raw.get("tp_backward_ms", {}), f"{where}.tp_backward_ms"),
                   sp_forward_ms=_degree_tables(raw.get("sp_forward_ms", {}), f"{where}.sp_forward_ms"),
                   sp_backward_ms=_degree_tables(raw.get("sp_backward_ms", {}), f"{where}.sp_backward_ms"),
                   sp_selective_backward_ms=_degree_tables(raw.get("sp_selective_backward_ms", {}),
                                                           f"{where}.sp_selective_backward_ms"),
                   zero3_forward_ms=_degree_tables(raw.get("zero3_forward_ms", {}), f"{where}.zero3_forward_ms"),
                   zero3_backward_ms=_degree_tables(raw.get("zero3_backward_ms", {}), f"{where}.zero3_backward_ms"))

    def to_dict(self) -> dict[str, Any]:
        out = {"signature": self.signature.to_dict(),
               "forward_ms": {str(k): v for k, v in self.forward_ms.items()},
               "backward_ms": {str(k): v for k, v in self.backward_ms.items()},
               "parameter_bytes": self.parameter_bytes,
               "activation_bytes_per_sample": dict(self.activation_bytes_per_sample)}
        for name in ("tp_forward_ms", "tp_backward_ms", "sp_forward_ms", "sp_backward_ms", "sp_selective_backward_ms",
                     "zero3_forward_ms", "zero3_backward_ms"):
            if getattr(self, name):
                out[name] = {str(tp): {str(b): ms for b, ms in t.items()} for tp, t in getattr(self, name).items()}
        return out


@dataclass(frozen=True, kw_only=True)
class VocabProfile:
    """Measured embedding + head (+ loss) of the model."""

    forward_ms: dict[int, float]
    """Forward ms of embedding and head together, keyed by micro-batch size."""
    backward_ms: dict[int, float]
    """Backward ms, keyed by micro-batch size."""
    parameter_bytes: float
    """Parameters of embedding and head in the profiled dtype, bytes."""

    @classmethod
    def from_dict(cls, raw: Any, where: str = "vocab") -> "VocabProfile":
        if not isinstance(raw, Mapping):
            raise ProfileError(where, f"must be an object, got {raw!r}")
        return cls(forward_ms=_batch_table(raw.get("forward_ms"), f"{where}.forward_ms"),
                   backward_ms=_batch_table(raw.get("backward_ms"), f"{where}.backward_ms"),
                   parameter_bytes=_number(raw.get("parameter_bytes"), f"{where}.parameter_bytes",
                                           strict=False))

    def to_dict(self) -> dict[str, Any]:
        return {"forward_ms": {str(k): v for k, v in self.forward_ms.items()},
                "backward_ms": {str(k): v for k, v in self.backward_ms.items()},
                "parameter_bytes": self.parameter_bytes}


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A whole profile file (docs/profile_format.md). Tables are plain dicts (not hashable)."""

    hardware: dict[str, Any] = field(default_factory=dict)
    """Free-form description: device, world_size, dtype, torch version."""
    layers: tuple[LayerProfile, ...] = ()
    """One entry per profiled layer type."""
    vocab: VocabProfile | None = None
    """Embedding and head, if profiled."""
    allreduce_gbytes_per_s: dict[str, float] = field(default_factory=dict)
    """NCCL all-reduce bus bandwidth, GB/s, keyed '<group size>_consec' or '<size>_strided'."""
    allreduce_latency_us: float = 0.0
    """Fixed cost of one all-reduce, microseconds."""
    collective_gbytes_per_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """Bus bandwidth of the other collectives the job's backend runs, GB/s, per kind
    (COLLECTIVE_KINDS), keyed as allreduce_gbytes_per_s: bytes x (g - 1) / g over the time. A
    kind not here runs at the all-reduce's bus bandwidth (the ring formulas; NCCL does about
    that, gloo runs reduce-scatter as an all-reduce)."""
    p2p_gbytes_per_s: dict[str, float] = field(default_factory=dict)
    """Pipeline send/recv bandwidth, GB/s, keyed by pipeline degree."""
    overlap_coefficient: float = 1.0
    """Slowdown (>= 1) of compute and communication running together (Galvatron's gamma)."""
    optimizer_ms_per_mparam: float = 0.0
    """One optimizer step (the executor's Adam over fp32 master weights, then the copy back to
    the model's parameters) per million parameters a rank updates, milliseconds; 0 = not
    measured (Galvatron's profiles have no such figure): the step then costs nothing."""
    format: str = FORMAT
    version: int = VERSION

    def __post_init__(self) -> None:
        if self.format != FORMAT:
            raise ProfileError("format", f"must be {FORMAT!r}, got {self.format!r}")
        if self.version != VERSION:
            raise ProfileError("version", f"unsupported version {self.version!r} (this code reads {VERSION})")
        object.__setattr__(self, "layers", tuple(self.layers))
        _check_group_keys(self.allreduce_gbytes_per_s, "allreduce_gbytes_per_s")
        for kind, table in self.collective_gbytes_per_s.items():
            if kind not in COLLECTIVE_KINDS:
                raise ProfileError("collective_gbytes_per_s", f"kind must be one of {', '.join(COLLECTIVE_KINDS)}, "
                                   f"got {kind!r}")
            _check_group_keys(table, f"collective_gbytes_per_s.{kind}")
        for key in self.p2p_gbytes_per_s:
            _positive_key(key, "p2p_gbytes_per_s")
        self._check_values()
        _number(self.allreduce_latency_us, "allreduce_latency_us", strict=False)
        _number(self.overlap_coefficient, "overlap_coefficient", minimum=1.0, strict=False)
        _number(self.optimizer_ms_per_mparam, "optimizer_ms_per_mparam", strict=False)
        seen = set()
        for i, layer in enumerate(self.layers):
            if layer.signature in seen:
                raise ProfileError(f"layers[{i}].signature", f"duplicate layer type {layer.signature}")
            seen.add(layer.signature)

    def _check_values(self) -> None:
        """Every time and bandwidth finite, > 0 and within the unit-time limit, whoever built the
        object (from_dict, or a reader of another format such as Galvatron's files)."""
        tables = [("allreduce_gbytes_per_s", self.allreduce_gbytes_per_s), ("p2p_gbytes_per_s", self.p2p_gbytes_per_s)]
        tables += [(f"collective_gbytes_per_s.{k}", t) for k, t in self.collective_gbytes_per_s.items()]
        for i, layer in enumerate(self.layers):
            tables += [(f"layers[{i}].forward_ms", layer.forward_ms), (f"layers[{i}].backward_ms", layer.backward_ms)]
        if self.vocab is not None:
            tables += [("vocab.forward_ms", self.vocab.forward_ms), ("vocab.backward_ms", self.vocab.backward_ms)]
        for where, table in tables:
            for key, value in table.items():
                _number(value, f"{where}[{key!r}]")

    def layer(self, spec: LayerSpec) -> LayerProfile:
        """The entry whose signature matches ``spec``, or a ProfileError listing what exists."""
        wanted = LayerSignature.of(spec)
        for entry in self.layers:
            if entry.signature == wanted:
                return entry
        have = "; ".join(str(e.signature.to_dict()) for e in self.layers) or "none"
        raise ProfileError("layers", f"no profile for {wanted.to_dict()} (profiled: {have})")

    @classmethod
    def from_dict(cls, raw: Any) -> "Profile":
        try:
            check(ProfileFile, raw)
        except SpecError as err:
            raise ProfileError(err.field, err.message) from None
        layers_raw = raw.get("layers", [])
        if not isinstance(layers_raw, list):
            raise ProfileError("layers", f"must be a list, got {layers_raw!r}")
        hardware = raw.get("hardware", {})
        if not isinstance(hardware, Mapping):
            raise ProfileError("hardware", f"must be an object, got {hardware!r}")
        vocab = raw.get("vocab")
        return cls(format=raw.get("format"), version=raw.get("version"), hardware=dict(hardware),
                   layers=tuple(LayerProfile.from_dict(x, f"layers[{i}]") for i, x in enumerate(layers_raw)),
                   vocab=None if vocab is None else VocabProfile.from_dict(vocab),
                   allreduce_gbytes_per_s=_table(raw.get("allreduce_gbytes_per_s", {}),
                                                 "allreduce_gbytes_per_s", allow_empty=True),
                   allreduce_latency_us=raw.get("allreduce_latency_us", 0.0),
                   collective_gbytes_per_s={kind: _table(table, f"collective_gbytes_per_s.{kind}", allow_empty=True)
                                            for kind, table in raw.get("collective_gbytes_per_s", {}).items()},
                   p2p_gbytes_per_s=_table(raw.get("p2p_gbytes_per_s", {}), "p2p_gbytes_per_s",
                                           allow_empty=True),
                   overlap_coefficient=raw.get("overlap_coefficient", 1.0),
                   optimizer_ms_per_mparam=raw.get("optimizer_ms_per_mparam", 0.0))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "version": self.version,
                               "hardware": dict(self.hardware),
                               "layers": [layer.to_dict() for layer in self.layers]}
        if self.vocab is not None:
            out["vocab"] = self.vocab.to_dict()
        if self.collective_gbytes_per_s:
            out["collective_gbytes_per_s"] = {kind: dict(t) for kind, t in self.collective_gbytes_per_s.items()}
        out.update(allreduce_gbytes_per_s=dict(self.allreduce_gbytes_per_s),
                   allreduce_latency_us=self.allreduce_latency_us,
                   p2p_gbytes_per_s=dict(self.p2p_gbytes_per_s),
                   overlap_coefficient=self.overlap_coefficient,
                   optimizer_ms_per_mparam=self.optimizer_ms_per_mparam)
        return out


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; errors name the file and the field."""
    try:
        return load_json_with(path, Profile.from_dict)
    except SpecError as err:
        raise ProfileError(err.field, err.message, err.source) from None


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` as JSON atomically (a crash never leaves half a file)."""
    Profile.from_dict(profile.to_dict())  # refuse to write what could not be read back
    atomic_write_json(path, profile.to_dict())
