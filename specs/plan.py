"""Plan: how a model is trained on a cluster: pipeline stages and one strategy per layer."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from specs.errors import SpecError, check_fields, load_json_with, one_of, positive_int
from specs.files import atomic_write_text

PLAN_VERSION = 1


class DPType(StrEnum):
    """How a data-parallel group holds the model states (the JSON value is the lower-case name)."""

    DDP = "ddp"
    """Full replicas; gradients all-reduced."""
    ZERO1 = "zero1"
    """Optimizer states sharded (Megatron/DeepSpeed distributed optimizer)."""
    ZERO2 = "zero2"
    """ZeRO-1 plus gradients sharded."""
    ZERO3 = "zero3"
    """ZeRO-2 plus parameters sharded (FSDP)."""


class Schedule(StrEnum):
    """Pipeline schedule of the micro-batches."""

    GPIPE = "gpipe"
    """All forwards, then all backwards."""
    ONE_F_ONE_B = "1f1b"
    """One forward, one backward in the steady state (PipeDream-flush)."""


class Recompute(StrEnum):
    """Activation recomputation of a layer (a Plan expresses none and full as ``checkpoint``)."""

    NONE = "none"
    """Keep every activation for backward."""
    SELECTIVE = "selective"
    """Recompute only the attention core (Megatron's selective; not expressible in a Plan yet)."""
    FULL = "full"
    """Keep the layer's input only; recompute its forward in backward."""


DP_TYPES = tuple(DPType)
SCHEDULES = tuple(Schedule)


@dataclass(frozen=True, kw_only=True)
class LayerStrategy:
    """How one layer is split over the GPUs of its pipeline stage."""

    tp: int = 1
    """Tensor (Megatron column/row) parallel degree."""
    dp: int = 1
    """Data parallel degree; tp * dp = GPUs of the stage."""
    dp_type: DPType = DPType.DDP
    """One of DPType (a plain string is converted)."""
    tp_consecutive: bool = True
    """TP group on neighbouring ranks (True) or strided across the stage (False)."""
    checkpoint: bool = False
    """Recompute this layer's activations in backward (keep only its input)."""
    sp: bool = False
    """Megatron sequence parallelism on the tp group (reserved; no planner chooses it yet)."""

    def __post_init__(self) -> None:
        positive_int(self.tp, "tp")
        positive_int(self.dp, "dp")
        object.__setattr__(self, "dp_type", DPType(one_of(self.dp_type, DP_TYPES, "dp_type")))
        for name in ("tp_consecutive", "checkpoint", "sp"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(name, f"must be true or false, got {getattr(self, name)!r}")

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    def short(self) -> str:
        """Compact text, e.g. ``tp2/dp2 zero3 ckpt``."""
        parts = [f"tp{self.tp}" + ("" if self.tp_consecutive or self.tp == 1 or self.dp == 1 else "s")
                 + f"/dp{self.dp}"]
        if self.dp > 1 and self.dp_type != DPType.DDP:
            parts.append(self.dp_type)
        if self.checkpoint:
            parts.append("ckpt")
        if self.sp:
            parts.append("sp")
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Pipeline degree and partition, per-layer strategies, batch and schedule."""

    pp: int
    """Pipeline degree (number of stages)."""
    stage_layers: tuple[int, ...]
    """Layers in each stage, in order; sums to the number of layers."""
    layers: tuple[LayerStrategy, ...]
    """One strategy per layer."""
    global_batch: int
    """Samples per iteration."""
    micro_batches: int
    """Micro-batches per iteration (Galvatron's 'chunks')."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    """One of Schedule (a plain string is converted)."""
    vocab_tp: int = 1
    """Tensor parallel degree of the embedding and the head."""
    model: str = ""
    """Zoo name or config path of the model this plan is for (informative)."""
    cluster: str = ""
    """Zoo name or file of the cluster (informative)."""
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        positive_int(self.pp, "pp")
        positive_int(self.global_batch, "global_batch")
        positive_int(self.micro_batches, "micro_batches")
        positive_int(self.vocab_tp, "vocab_tp")
        object.__setattr__(self, "schedule", Schedule(one_of(self.schedule, SCHEDULES, "schedule")))
        if not isinstance(self.stage_layers, (list, tuple)):
            raise SpecError("stage_layers", f"must be a list of layer counts, got {self.stage_layers!r}")
        object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        object.__setattr__(self, "layers", tuple(self.layers))
        if len(self.stage_layers) != self.pp:
            raise SpecError("stage_layers", f"{len(self.stage_layers)} stages listed for pp({self.pp})")
        for i, n in enumerate(self.stage_layers):
            positive_int(n, f"stage_layers[{i}]")
        if sum(self.stage_layers) != len(self.layers):
            raise SpecError("stage_layers", f"sum {sum(self.stage_layers)} != {len(self.layers)} layers")

    # -- structure --------------------------------------------------------------------
    def stage_ranges(self) -> list[range]:
        """Layer indices of each stage."""
        out, start = [], 0
        for n in self.stage_layers:
            out.append(range(start, start + n))
            start += n
        return out

    def stage_first_rank(self, stage: int, world_size: int) -> int:
        return stage * (world_size // self.pp)

    def micro_batch_size(self, layer: int) -> int:
        """Samples per micro-batch per data-parallel replica at ``layer``."""
        return self.global_batch // (self.layers[layer].dp * self.micro_batches)

    def summary(self) -> str:
        """One line: ``pp2 | L0-15 tp2/dp2 zero3 | L16-31 dp4 ckpt`` (runs of equal layers)."""
        parts = [f"pp{self.pp} m{self.micro_batches}"]
        start = 0
        for i in range(1, len(self.layers) + 1):
            if i == len(self.layers) or self.layers[i] != self.layers[start]:
                span = f"L{start}" if i - 1 == start else f"L{start}-{i - 1}"
                parts.append(f"{span} {self.layers[start].short()}")
                start = i
        return " | ".join(parts)

    # -- validation -------------------------------------------------------------------
    def validate(self, model: Any, cluster: Any) -> None:
        """Raise SpecError naming the field and the numbers if the plan cannot run."""
        world, n_layers = cluster.world_size, model.num_layers
        if len(self.layers) != n_layers:
            raise SpecError("layers", f"{len(self.layers)} strategies for a model of {n_layers} layers")
        if world % self.pp:
            raise SpecError("pp", f"pp({self.pp}) does not divide the world size {world}")
        per_stage = world // self.pp
        if self.schedule == Schedule.ONE_F_ONE_B and self.micro_batches < self.pp:
            raise SpecError("micro_batches", f"1f1b needs micro_batches({self.micro_batches}) >= pp({self.pp})")
        for i, (s, spec) in enumerate(zip(self.layers, model.layers)):
            _check_layer(i, s, spec, per_stage, self.global_batch, self.micro_batches)
        heads = getattr(model.embedding, "vocab_size", 0) or 0
        if self.vocab_tp > per_stage or (heads and heads % self.vocab_tp):
            raise SpecError("vocab_tp", f"vocab_tp({self.vocab_tp}) must divide vocab({heads}) and "
                            f"be <= {per_stage} GPUs per stage")

    # -- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_layers"] = list(self.stage_layers)
        d["layers"] = [asdict(s) for s in self.layers]
        return d

    @classmethod
    def from_dict(cls, raw: Any) -> "Plan":
        if not isinstance(raw, dict):
            raise SpecError("(top level)", f"expected a JSON object, got {type(raw).__name__}")
        version = raw.get("version", PLAN_VERSION)
        if version != PLAN_VERSION:
            raise SpecError("version", f"unsupported plan version {version!r} (this code reads {PLAN_VERSION})")
        layers_raw = raw.get("layers")
        if not isinstance(layers_raw, list):
            raise SpecError("layers", f"must be a list of strategies, got {layers_raw!r}")
        layers = tuple(_strategy(i, item) for i, item in enumerate(layers_raw))
        fields = {k: v for k, v in raw.items() if k != "layers"}
        check_fields(cls, [*fields, "layers"])
        return cls(layers=layers, **fields)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: str | Path) -> None:
        """Write atomically (a crash never leaves half a plan)."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return load_json_with(path, cls.from_dict)


def even_stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible, the first stages taking one more: (3, 3, 2) for 8/3."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def uniform_plan(num_layers: int, *, tp: int = 1, dp: int = 1, pp: int = 1, global_batch: int,
                 micro_batches: int = 1, dp_type: str = DPType.DDP, checkpoint: bool = False,
                 schedule: str = Schedule.ONE_F_ONE_B, tp_consecutive: bool = True, **meta: Any) -> Plan:
    """Every layer the same strategy; layers split as evenly as possible over pp stages."""
    positive_int(pp, "pp")
    if num_layers < pp:
        raise SpecError("pp", f"pp({pp}) exceeds the {num_layers} layers")
    stage_layers = even_stage_layers(num_layers, pp)
    strategy = LayerStrategy(tp=tp, dp=dp, dp_type=dp_type if dp > 1 else DPType.DDP,
                             tp_consecutive=tp_consecutive, checkpoint=checkpoint)
    return Plan(pp=pp, stage_layers=stage_layers, layers=(strategy,) * num_layers,
                global_batch=global_batch, micro_batches=micro_batches, schedule=schedule, **meta)


def _check_layer(i: int, s: LayerStrategy, spec: Any, per_stage: int, batch: int, micro: int) -> None:
    if s.tp * s.dp != per_stage:
        raise SpecError(f"layer {i}", f"tp({s.tp})*dp({s.dp}) = {s.tp * s.dp} != {per_stage} GPUs per stage")
    if spec.num_heads % s.tp:
        raise SpecError(f"layer {i}", f"tp({s.tp}) does not divide heads({spec.num_heads})")
    if spec.kv_heads % s.tp and s.tp % spec.kv_heads:
        raise SpecError(f"layer {i}", f"tp({s.tp}) and kv heads({spec.kv_heads}) do not divide each other")
    if batch % (s.dp * micro):
        raise SpecError(f"layer {i}", f"global_batch({batch}) is not divisible by "
                        f"dp({s.dp})*micro_batches({micro}) = {s.dp * micro}")
    if s.dp == 1 and s.dp_type != DPType.DDP:
        raise SpecError(f"layer {i}", f"dp_type {s.dp_type} needs dp > 1 (dp is 1)")


def _strategy(i: int, item: Any) -> LayerStrategy:
    if not isinstance(item, dict):
        raise SpecError(f"layers[{i}]", f"must be an object, got {item!r}")
    check_fields(LayerStrategy, item, f"layers[{i}]")
    try:
        return LayerStrategy(**item)
    except SpecError as err:
        raise SpecError(f"layers[{i}].{err.field}", err.message) from None

