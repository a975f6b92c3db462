"""Schemas of the input files (pydantic, strict) checked at the file boundary, before the frozen
dataclasses are built: per-field types and ranges, the stated limits, cross-field rules.
``check(Schema, raw)`` turns the first violation into one SpecError line naming the field."""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from specs.axes import Recompute
from specs.errors import SpecError
from specs.limits import (MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_MICRO_BATCHES,
                          MAX_NODES, MAX_SCALE_UP_DOMAIN_GPUS, MAX_WIDTH)
from specs.schedules import SCHEDULES
from specs.stack import STACKS

_SCHEDULE_NAMES = tuple(s.value for s in SCHEDULES)
"""The registered pipeline schedules (specs.schedules)."""
_STACK_NAMES = tuple(s.value for s in STACKS)
"""The software stacks (specs.stack)."""
_RECOMPUTE_NAMES = tuple(r.value for r in Recompute)
"""The recomputations (specs.axes.Recompute)."""

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)
_OPEN = ConfigDict(strict=True, extra="allow", frozen=True)
Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]
Layers = Annotated[int, Field(ge=1, le=MAX_LAYERS)]
ChunkLayers = Annotated[int, Field(ge=0, le=MAX_LAYERS)]
"""A model chunk's layers: the first and last chunk may hold none (Plan.chunk_layers)."""
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Version1 = Annotated[int, Field(ge=1, le=1)]
"""Format version 1 (an int field, so that ``true`` is not taken for 1)."""
PlanVersion = Annotated[int, Field(ge=1, le=2)]
"""Plan format 1 (Ulysses degree in tp) or 2 (its own ``ulysses`` field)."""


def check(schema: type[BaseModel], raw: Any) -> BaseModel:
    """``raw`` validated by ``schema``; the first problem is one SpecError naming its field."""
    if not isinstance(raw, dict):
        raise SpecError("(top level)", f"expected a JSON object, got {type(raw).__name__}")
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        # a wrong value says more than a missing key that the wrong value may explain
        errors = sorted(err.errors(), key=lambda e: e["type"] == "missing")
        raise _spec_error(errors[0]) from None


def _spec_error(item: dict[str, Any]) -> SpecError:
    field = "".join(_part(p) for p in item["loc"]).lstrip(".")
    message = str(item["msg"]).replace("Value error, ", "").replace("\n", " ")
    named = _NAMED.match(message)
    if not field and named:  # a cross-field rule names its field: "field: message"
        field, message = named.groups()
    if item["type"] not in ("missing", "value_error") and "input" in item:
        message += f", got {_short(item['input'])}"
    return SpecError(field or "(top level)", message)


def _part(key: int | str) -> str:
    """One step of a field path; a key that is not a plain name is quoted (it may hold a newline)."""
    if isinstance(key, int):
        return f"[{key}]"
    return f".{key}" if re.fullmatch(r"[A-Za-z_][\w-]*", key) else f"[{key!r}]"


_NAMED = re.compile(r"([A-Za-z_][\w.\[\]*]*): (.*)")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- cluster files ----------------------------------------------------------------------------
class GPUFile(BaseModel):
    model_config = _STRICT
    name: str
    peak_tflops: Positive
    memory_gib: Positive
    memory_bandwidth_gbytes_per_s: Positive
    source: str = ""
    """Where the figures come from (data sheet)."""
    peak_fp8_tflops: Positive | None = None
    """Dense FP8 tensor-core peak, TFLOP/s (FP8 plans run at it; none: refused)."""
    mxfp8: bool = False
    """Tensor cores with MX block-scaled FP8 (Blackwell)."""
    sdpa_flash_tflops: Positive | None = None
    """PyTorch SDPA's default fused attention kernel on this GPU, TFLOP/s (none: at the GEMM efficiency)."""


class IntraNodeFile(BaseModel):
    model_config = _STRICT
    kind: Literal["nvswitch", "nvlink", "pcie", "shm"]
    bandwidth_gbytes_per_s: Positive
    latency_us: NonNegative
    gpus_per_switch: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] = 0
    switch_uplink_gbytes_per_s: NonNegative = 0.0


class InterNodeFile(BaseModel):
    model_config = _STRICT
    nics_per_node: Annotated[int, Field(ge=1, le=64)] = 1
    nic_bandwidth_gbytes_per_s: Positive = 12.5
    latency_us: NonNegative = 10.0


class ClusterFile(BaseModel):
    model_config = _STRICT
    name: str = "cluster"
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = 1
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)]
    gpu: GPUFile
    intra_node: IntraNodeFile
    inter_node: InterNodeFile = InterNodeFile()
    calibration: str = ""
    scale_up_domain_gpus: Annotated[int, Field(ge=0, le=MAX_SCALE_UP_DOMAIN_GPUS)] = 0
    """GPUs of one NVLink domain (0 = one node); a multiple of gpus_per_node."""
    sources: dict[str, Annotated[str, Field(min_length=1, max_length=2000)]] = {}
    """Field path (``gpu.peak_tflops``) -> where that figure comes from."""

    @model_validator(mode="after")
    def _rules(self) -> "ClusterFile":
        domain = self.scale_up_domain_gpus
        if domain and domain % self.gpus_per_node:
            raise ValueError(f"scale_up_domain_gpus: {domain} is not a multiple of gpus_per_node({self.gpus_per_node})")
        if domain > self.gpus_per_node and self.intra_node.kind not in ("nvswitch", "nvlink"):
            raise ValueError(f"scale_up_domain_gpus: a domain of {domain} GPUs beyond one node needs an nvswitch "
                             f"or nvlink intra_node link, not {self.intra_node.kind!r}")
        for key in self.sources:
            if not _names_a_field(self, key):
                raise ValueError(f"sources: {key!r} names no field of the cluster file")
        per = self.intra_node.gpus_per_switch
        if per and self.gpus_per_node % per:
            raise ValueError(f"intra_node.gpus_per_switch: gpus_per_switch({per}) does not divide gpus_per_node({self.gpus_per_node})")
        if per and self.intra_node.kind == "pcie" and not self.intra_node.switch_uplink_gbytes_per_s:
            raise ValueError("intra_node.switch_uplink_gbytes_per_s: must be > 0 when gpus_per_switch is set")
        if self.nodes * self.gpus_per_node > MAX_GPUS:
            raise ValueError(f"nodes: nodes({self.nodes})*gpus_per_node({self.gpus_per_node}) exceeds the limit "
                             f"of {MAX_GPUS:,} GPUs")
        return self


def _names_a_field(model: BaseModel, path: str) -> bool:
    """``path`` (``gpu.peak_tflops``) is a field of ``model`` or of one of its sections."""
    head, _, rest = path.partition(".")
    if head not in type(model).model_fields:
        return False
    value = getattr(model, head)
    return not rest or (isinstance(value, BaseModel) and _names_a_field(value, rest))


# -- plan files ---------------------------------------------------------------------------------
class StrategyFile(BaseModel):
    model_config = _STRICT
    tp: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    dp: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    dp_type: Literal["ddp", "zero1", "zero2", "zero3"] = "ddp"
    tp_consecutive: bool = True
    recompute: Literal[_RECOMPUTE_NAMES] | None = None  # type: ignore[valid-type]
    checkpoint: bool | None = None
    """Before issue 15 (still read): true = recompute full."""
    sp: bool | Literal["none", "megatron", "ulysses"] = "none"
    """Before issue 15 a boolean (true = megatron)."""
    ulysses: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    cp: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    cp_comm: Literal["p2p", "all_gather", "a2a+p2p"] = "p2p"
    ep: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    expert_tp: Annotated[int, Field(ge=0, le=MAX_GPUS)] = 0
    expert_dp_type: Literal["ddp", "zero1", "zero2", "zero3"] | None = None
    precision: Literal["bf16", "fp8-delayed", "fp8-current", "mxfp8"] = "bf16"
    """specs.precision.Precision; files without it are bf16."""


class PlanFile(BaseModel):
    model_config = _STRICT
    version: PlanVersion = 1
    pp: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    stage_layers: list[Layers]
    layers: Annotated[list[StrategyFile], Field(min_length=1, max_length=MAX_LAYERS)]
    global_batch: Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH)]
    micro_batches: Annotated[int, Field(ge=1, le=MAX_MICRO_BATCHES)]
    schedule: Literal[_SCHEDULE_NAMES] = "1f1b"  # type: ignore[valid-type]
    vocab_tp: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    vocab_zero3: bool = False
    vocab_sp: Literal["none", "megatron", "ulysses"] = "none"
    cp_load_balance: Literal["zigzag", "none"] = "zigzag"
    stack: Literal[_STACK_NAMES] | None = None  # type: ignore[valid-type]
    tp_comm_overlap: bool = False
    """Plan.tp_comm_overlap; files without it do not overlap."""
    ep_dispatcher: Literal["all_to_all", "deepep"] = "all_to_all"
    """Plan.ep_dispatcher; files without it dispatch by all-to-all."""
    virtual_stages: Annotated[int, Field(ge=1, le=MAX_LAYERS)] = 1
    chunk_layers: list[ChunkLayers] = []
    model: str = ""
    cluster: str = ""
    model_spec: dict[str, Any] | None = None
    cluster_spec: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _rules(self) -> "PlanFile":
        if len(self.stage_layers) != self.pp:
            raise ValueError(f"stage_layers: {len(self.stage_layers)} stages listed for pp({self.pp})")
        if sum(self.stage_layers) != len(self.layers):
            raise ValueError(f"stage_layers: sum {sum(self.stage_layers)} != {len(self.layers)} layers")
        return self


# -- calibration files --------------------------------------------------------------------------
class CalibrationFile(BaseModel):
    model_config = _OPEN  # fitted_on, procedure, ... are free-form notes
    format: Literal["hybridpar-calibration"]
    version: Version1
    cluster: str = ""
    gpu: str = ""
    """The GPU the constants were fitted on (GPUSpec.name, ``A100-SXM4-80GB``); '' = not stated."""
    data: str = ""
    """Short name of the measurements fitted (``vtrain``), shown in the calibration status."""
    constants: dict[str, Finite]
    """Finite numbers; their ranges (most >= 0, the CV error band signed) are AnalyticalConstants' rules."""


# -- Hugging Face style model configs ---------------------------------------------------------
class ModelConfigFile(BaseModel):
    """The keys specs.hf_config reads; other Hugging Face keys pass unread."""

    model_config = _OPEN
    model_type: str
    name: str | None = None
    hidden_size: Width | None = None
    n_embd: Width | None = None
    d_model: Width | None = None
    embed_dim: Width | None = None
    num_attention_heads: Width | None = None
    n_head: Width | None = None
    num_heads: Width | Annotated[list[Width], Field(min_length=1, max_length=64)] | None = None
    num_key_value_heads: Width | None = None
    intermediate_size: Width | None = None
    n_inner: Width | None = None
    d_ff: Width | None = None
    d_kv: Width | None = None
    seq_length: Width | None = None
    decoder_seq_length: Width | None = None
    max_position_embeddings: Width | None = None
    n_positions: Width | None = None
    n_ctx: Width | None = None
    vocab_size: Width | None = None
    type_vocab_size: Width | None = None
    image_size: Width | None = None
    patch_size: Width | None = None
    window_size: Width | None = None
    num_channels: Width | None = None
    num_labels: Width | None = None
    relative_attention_num_buckets: Width | None = None
    num_hidden_layers: Layers | None = None
    n_layer: Layers | None = None
    num_layers: Layers | None = None
    num_decoder_layers: Layers | None = None
    depths: Annotated[list[Layers], Field(min_length=1, max_length=64)] | None = None
    mlp_ratio: Annotated[float, Field(gt=0, le=1024, allow_inf_nan=False)] | None = None
    tie_word_embeddings: bool | None = None
    attention_bias: bool | None = None
    feed_forward_proj: str | None = None

    @model_validator(mode="after")
    def _rules(self) -> "ModelConfigFile":
        total = (self.num_layers or 0) + (self.num_decoder_layers or 0) + sum(self.depths or ())
        if total > MAX_LAYERS:
            raise ValueError(f"layers: {total:,} in all exceeds the limit of {MAX_LAYERS:,} blocks")
        return self


# -- Galvatron's files ------------------------------------------------------------------------
_CSV_INTS = re.compile(r"\s*[0-9]{1,6}\s*(,\s*[0-9]{1,6}\s*)*")
CsvInts = Annotated[str, Field(pattern=_CSV_INTS.pattern, max_length=8 * MAX_LAYERS)]
Flag = Annotated[int, Field(ge=0, le=1)]


class GalvatronPlanFile(BaseModel):
    model_config = _OPEN  # vsp, embed_sdp, ... are read by Galvatron only
    pp_deg: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    tp_sizes_enc: CsvInts
    tp_consecutive_flags: CsvInts = None  # type: ignore[assignment]  (absent: Galvatron's default; null: refused)
    dp_types_enc: CsvInts = None  # type: ignore[assignment]  (absent: Galvatron's default; null: refused)
    use_sp: CsvInts = None  # type: ignore[assignment]  (absent: Galvatron's default; null: refused)
    checkpoint: CsvInts = None  # type: ignore[assignment]  (absent: Galvatron's default; null: refused)
    pp_division: CsvInts = None  # type: ignore[assignment]  (absent: Galvatron's default; null: refused)
    cp_sizes_enc: CsvInts = None  # type: ignore[assignment]  (absent: cp 1 on every layer; null: refused)
    global_bsz: Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH)]
    chunks: Annotated[int, Field(ge=1, le=MAX_MICRO_BATCHES)] = 1
    pipeline_type: Literal["gpipe", "pipedream_flush"] = "pipedream_flush"
    default_dp_type: Literal["ddp", "zero2"] = "ddp"
    vtp: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    vsp: Flag = 0
    """Galvatron's vocabulary sequence parallelism (Plan.vocab_sp)."""
    embed_sdp: Flag = 0
    """Galvatron's ZeRO-3 for the embedding (Plan.vocab_zero3)."""
    vcp: Annotated[int, Field(ge=1, le=MAX_GPUS)] = 1
    """Galvatron-2's context-parallel degree of the vocabulary (only 1 is read: Plan has no field)."""


# -- Galvatron's profile files (read by cost_models.galvatron_profile) ------------------------
NumberTable = Annotated[dict[str, NonNegative], Field(min_length=1)]
BandwidthTable = Annotated[dict[str, Positive], Field(min_length=1)]
"""GB/s per group: zero would make a division by zero, so every entry is > 0."""


class GalvatronLayerMemory(BaseModel):
    model_config = _OPEN
    parameter_size: NonNegative
    """fp32 MiB of one layer's parameters."""
    tp_activation_per_bsz_dict: NumberTable
    """MiB of activations per sample, by tp degree (and 'checkpoint')."""


class GalvatronOtherMemory(BaseModel):
    model_config = _OPEN
    model_states: NumberTable
    activation: NumberTable


class GalvatronOverlap(BaseModel):
    model_config = _OPEN
    overlap_coe: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)]


_MEMORY_SECTIONS = (("layertype_", dict[str, GalvatronLayerMemory]), ("other_memory_", dict[str, GalvatronOtherMemory]))
_GALVATRON = {"computation_profiling": NumberTable, "allreduce_bandwidth": BandwidthTable,
              "p2p_bandwidth": BandwidthTable, "overlap_coefficient": GalvatronOverlap, "sp_time": NumberTable}


def check_galvatron_file(kind: str, raw: Any) -> None:
    """The structure of one of Galvatron's profile files (``kind``: the file name's stem up to
    its first '_<digit>' or its '_bf16'/'_fp16', e.g. 'memory_profiling'), every number finite;
    the first problem is one SpecError naming the key path."""
    if not isinstance(raw, dict):
        raise SpecError("(top level)", f"expected a JSON object, got {type(raw).__name__}")
    if kind == "memory_profiling":
        for key, value in raw.items():
            schema = next((s for prefix, s in _MEMORY_SECTIONS if key.startswith(prefix)), NumberTable)
            _validate(schema, value, (key,))
        return
    _validate(_GALVATRON[kind], raw, ())


def _validate(schema: Any, raw: Any, at: tuple) -> None:
    try:
        TypeAdapter(schema).validate_python(raw, strict=True)
    except ValidationError as err:
        item = err.errors()[0]
        raise _spec_error({**item, "loc": at + tuple(item["loc"])}) from None


# -- profile files (format hybridpar-profile, docs/profile_format.md) ----------------------------
BatchKey = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]
BatchTable = Annotated[dict[BatchKey, Positive], Field(min_length=1)]


class SignatureFile(BaseModel):
    model_config = _STRICT
    kind: str
    hidden_size: Width
    num_heads: Width
    num_kv_heads: Width | None = None
    ffn_hidden_size: Width
    seq_len: Width


class LayerProfileFile(BaseModel):
    model_config = _STRICT
    signature: SignatureFile
    forward_ms: BatchTable
    backward_ms: BatchTable
    parameter_bytes: NonNegative
    activation_bytes_per_sample: dict[Annotated[str, Field(pattern=r"^([0-9]{1,9}|ckpt)$")], NonNegative]
    tp_forward_ms: dict[BatchKey, BatchTable] = {}
    tp_backward_ms: dict[BatchKey, BatchTable] = {}
    sp_forward_ms: dict[BatchKey, BatchTable] = {}
    sp_backward_ms: dict[BatchKey, BatchTable] = {}
    sp_selective_backward_ms: dict[BatchKey, BatchTable] = {}
    zero3_forward_ms: dict[BatchKey, BatchTable] = {}
    zero3_backward_ms: dict[BatchKey, BatchTable] = {}


class VocabProfileFile(BaseModel):
    model_config = _STRICT
    forward_ms: BatchTable
    backward_ms: BatchTable
    parameter_bytes: NonNegative


GroupKey = Annotated[str, Field(pattern=r"^[0-9]{1,6}_(consec|strided)$")]
"""A communication group: '<size>_consec' (consecutive ranks) or '<size>_strided'."""


class ProfileFile(BaseModel):
    model_config = _STRICT
    format: Literal["hybridpar-profile"]
    version: Version1
    hardware: dict[str, Any] = {}
    """Free-form notes on where it was measured (device, torch version...)."""
    layers: Annotated[list[LayerProfileFile], Field(max_length=MAX_LAYERS)] = []
    vocab: VocabProfileFile | None = None
    allreduce_gbytes_per_s: dict[GroupKey, Positive] = {}
    allreduce_latency_us: NonNegative = 0.0
    collective_gbytes_per_s: dict[Literal["all_gather", "reduce_scatter"], dict[GroupKey, Positive]] = {}
    p2p_gbytes_per_s: dict[BatchKey, Positive] = {}
    overlap_coefficient: Annotated[float, Field(ge=1, le=100, allow_inf_nan=False)] = 1.0
    optimizer_ms_per_mparam: NonNegative = 0.0
