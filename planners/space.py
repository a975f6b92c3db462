"""The search space every planner shares: Galvatron's decision tree, its pruning rules and switches.

A Combo is one outer-loop point (global batch, pp, micro-batches, vocab tp, schedule); within it
each layer picks one of ``strategies(...)``; the pipeline partition is chosen by the planner.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

from specs import (DP_TYPES, SCHEDULES, ClusterSpec, DPType, LayerSpec, LayerStrategy, ModelSpec,
                   Schedule, SpecError)


def powers_of_two(limit: int) -> list[int]:
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Which plans a planner may return."""

    max_tp: int = 8
    """Largest tensor-parallel degree (Galvatron: 8, one node)."""
    max_pp: int = 8
    """Largest pipeline degree."""
    pp_degrees: tuple[int, ...] | None = None
    """Explicit pipeline degrees; None: every power of two up to max_pp."""
    tp_degrees: tuple[int, ...] | None = None
    """Explicit tp degrees; None: every power of two up to max_tp."""
    dp_types: tuple[str, ...] = DP_TYPES
    """Data-parallel flavours a layer may use when its dp > 1."""
    checkpoint: tuple[bool, ...] = (False, True)
    """Activation checkpointing choices per layer."""
    tp_consecutive: tuple[bool, ...] = (True, False)
    """TP rank layouts tried when tp > 1 and dp > 1."""
    schedule: str = Schedule.ONE_F_ONE_B
    """Pipeline schedule; 1f1b needs micro_batches >= pp."""
    micro_batches: tuple[int, ...] | None = None
    """Explicit micro-batch counts; None: powers of two dividing the batch, up to max_micro_batches."""
    max_micro_batches: int = 64
    vocab_tp: tuple[int, ...] | None = None
    """Explicit embedding/head tp degrees; None: powers of two up to the stage size dividing the vocab."""

    def __post_init__(self) -> None:
        for name in ("max_tp", "max_pp", "max_micro_batches"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise SpecError(name, f"must be a positive integer, got {v!r}")
        bad = [t for t in self.dp_types if t not in DP_TYPES]
        if bad or not self.dp_types:
            raise SpecError("dp_types", f"must be a non-empty subset of {', '.join(DP_TYPES)}; got {self.dp_types!r}")
        if self.schedule not in SCHEDULES:
            raise SpecError("schedule", f"must be 1f1b or gpipe, got {self.schedule!r}")
        if not self.checkpoint or not self.tp_consecutive:
            raise SpecError("checkpoint", "checkpoint and tp_consecutive need at least one choice")

    # -- presets and switches -------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "SearchSpace":
        """full (default), galvatron (the paper's: ddp+zero3, no checkpointing), dp+tp, dp+pp,
        3d (tp x pp x dp, plain DDP), and the pure dimensions dp, zero3, tp, pp."""
        full = cls()
        paper = cls(dp_types=(DPType.DDP, DPType.ZERO3), checkpoint=(False,))
        presets = {
            "full": full, "galvatron": paper,
            "dp+tp": replace(full, pp_degrees=(1,), dp_types=(DPType.DDP,)),
            "dp+pp": replace(full, tp_degrees=(1,), dp_types=(DPType.DDP,)),
            "3d": replace(full, dp_types=(DPType.DDP,)),
            "dp": replace(full, pp_degrees=(1,), tp_degrees=(1,), dp_types=(DPType.DDP,)),
            "zero3": replace(full, pp_degrees=(1,), tp_degrees=(1,), dp_types=(DPType.ZERO3,)),
        }
        if name not in presets:
            raise SpecError("space", f"unknown preset {name!r}; choose from {', '.join(presets)}")
        return presets[name]

    def widened(self, *, zero2: bool = False, checkpoint: bool = False) -> "SearchSpace":
        """The same space plus ZeRO-2 and/or activation checkpointing."""
        out = self
        if zero2 and DPType.ZERO2 not in out.dp_types:
            out = replace(out, dp_types=out.dp_types + (DPType.ZERO2,))
        if checkpoint and True not in out.checkpoint:
            out = replace(out, checkpoint=out.checkpoint + (True,))
        return out

    # -- enumeration ------------------------------------------------------------------------
    def pp_choices(self, model: ModelSpec, cluster: ClusterSpec) -> list[int]:
        world = cluster.world_size
        base = self.pp_degrees or tuple(powers_of_two(self.max_pp))
        return [p for p in base if p <= model.num_layers and world % p == 0 and p <= self.max_pp]

    def tp_choices(self, gpus: int) -> list[int]:
        base = self.tp_degrees or tuple(powers_of_two(self.max_tp))
        return [t for t in base if gpus % t == 0 and t <= gpus]

    def stage_strategies(self, gpus: int) -> list[LayerStrategy]:
        """Every strategy of a layer on a stage of ``gpus`` GPUs (before per-layer filters)."""
        out = []
        for tp in self.tp_choices(gpus):
            dp = gpus // tp
            dp_types = self.dp_types if dp > 1 else (DPType.DDP,)
            layouts = self.tp_consecutive if tp > 1 and dp > 1 else (True,)
            for dp_type in dp_types:
                for consec in layouts:
                    for ckpt in self.checkpoint:
                        out.append(LayerStrategy(tp=tp, dp=dp, dp_type=dp_type,
                                                 tp_consecutive=consec, checkpoint=ckpt))
        return out

    def micro_batch_choices(self, global_batch: int, pp: int) -> list[int]:
        base = self.micro_batches or tuple(powers_of_two(min(self.max_micro_batches, global_batch)))
        return [m for m in base if global_batch % m == 0 and (self.schedule == Schedule.GPIPE or m >= pp)]

    def vocab_tp_choices(self, model: ModelSpec, gpus: int) -> list[int]:
        vocab = model.embedding.vocab_size or 0
        base = self.vocab_tp or tuple(powers_of_two(min(gpus, self.max_tp)))
        return [v for v in base if v <= gpus and (not vocab or vocab % v == 0)]


def tp_splits(layer: LayerSpec, tp: int) -> bool:
    """tp divides the heads, the kv heads and the MLP width: the executor splits each of them
    (kv heads are not replicated over tp > kv heads), so a plan outside this never runs."""
    return not (layer.num_heads % tp or layer.kv_heads % tp or layer.ffn_hidden_size % tp)


def layer_allows(layer: LayerSpec, s: LayerStrategy, global_batch: int, micro_batches: int) -> bool:
    """The per-layer rules of Plan.validate and the executor: tp_splits, batch divisible by dp*m."""
    if not tp_splits(layer, s.tp):
        return False
    return global_batch % (s.dp * micro_batches) == 0


@dataclass(frozen=True)
class Combo:
    """One outer-loop point of the search."""

    global_batch: int
    pp: int
    micro_batches: int
    vocab_tp: int
    schedule: str


def combos(model: ModelSpec, cluster: ClusterSpec, global_batches: tuple[int, ...],
           space: SearchSpace) -> Iterator[Combo]:
    """Every outer-loop point where each layer has at least one allowed strategy."""
    kinds = model.layer_types()
    for gb in global_batches:
        for pp in space.pp_choices(model, cluster):
            gpus = cluster.world_size // pp
            strategies = space.stage_strategies(gpus)
            for m in space.micro_batch_choices(gb, pp):
                if not all(any(layer_allows(k, s, gb, m) for s in strategies) for k in kinds):
                    continue
                for v in space.vocab_tp_choices(model, gpus):
                    yield Combo(gb, pp, m, v, space.schedule)
