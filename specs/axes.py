"""Degrees: the named parallel axes of one layer (or of the embedding/head) on its pipeline stage,
and the one invariant they obey (their product is the stage's GPUs)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from enum import StrEnum

from specs.errors import SpecError, member, positive_int
from specs.hashing import cached_hash, without_cached_hash

DENSE_AXES = ("tp", "cp", "ulysses", "dp")
"""The axes that split a stage's ranks, in the documented order: tensor (the weights), context
(the sequence, ring attention), Ulysses (the sequence, head-split all-to-alls),
data (replicas). With consecutive tp the first axis varies fastest over the ranks (Megatron-Core's
tp-cp-dp order); strided tp moves dp to the front (specs.grid)."""

SPLIT_AXES = ("tp", "cp", "ulysses")
"""The axes that split one data-parallel replica's work (Ulysses' all-to-all group, tp's group)."""

GRAD_SYNC_AXES = ("cp", "ulysses", "dp")
"""The axes of the ranks holding the same weight shard: the gradient-sync and ZeRO group."""

EXPERT_AXES = ("etp", "ep", "edp")
"""A MoE layer's expert view over the same ranks: expert tensor, expert, expert data parallel."""


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


class SequenceParallel(StrEnum):
    """Sequence parallelism of a layer."""

    NONE = "none"
    """Tokens replicated over the tp group."""
    MEGATRON = "megatron"
    """Megatron-SP over the tp group: norms and dropouts split along the sequence; the
    all-reduces become reduce-scatter + all-gather (needs tp > 1)."""
    ULYSSES = "ulysses"
    """DeepSpeed-Ulysses over its own axis (degree ``ulysses``): the group splits the sequence,
    the weights stay whole (synchronised over ulysses * dp); all-to-alls switch to a head split
    around the attention core (needs the degree to divide heads and seq)."""


class CPComm(StrEnum):
    """How a context-parallel group exchanges keys and values (Megatron-Core's --cp-comm-type)."""

    P2P = "p2p"
    """Ring: cp - 1 steps, each sending the rank's K/V block to the next rank while attending
    to the block in hand (TransformerEngine's AttnFuncWithCPAndKVP2P)."""
    ALL_GATHER = "all_gather"
    """All-gather the whole sequence's K/V before the attention core, reduce-scatter their
    gradients after it; not overlapped with the attention compute."""
    A2A_P2P = "a2a+p2p"
    """Hierarchical (USP): Ulysses all-to-alls over the ``ulysses`` axis (a head split), then a
    ring over the ``cp`` axis with the local heads."""


class CPLoadBalance(StrEnum):
    """Token order of a context-parallel sequence under a causal mask (one order for the model:
    the batch is permuted once, before the embedding)."""

    ZIGZAG = "zigzag"
    """2 cp chunks, rank r holds chunks r and 2 cp - 1 - r (head-tail): every ring step does
    the same causal work on every rank (Megatron-Core, TransformerEngine, torchtitan)."""
    NONE = "none"
    """cp contiguous chunks: rank r's queries see r + 1 key blocks, so each ring step waits for
    the rank with the most unmasked work."""


class EPDispatcher(StrEnum):
    """How a plan's MoE layers send tokens to their experts over ep ranks and back (one choice per plan)."""

    ALL_TO_ALL = "all_to_all"
    """A pairwise all-to-all of the routed copies (Megatron-Core's ``alltoall`` dispatcher, torch's
    all_to_all_single): a token goes once per expert it is routed to."""
    DEEPEP = "deepep"
    """DeepSeek's DeepEP normal kernels: a token goes once per destination scale-up domain over the
    network (RDMA), then once per destination GPU inside that domain over NVLink; combine is the reverse."""


class Recompute(StrEnum):
    """Activation recomputation of a layer in backward."""

    NONE = "none"
    """Keep every activation for backward."""
    SELECTIVE = "selective"
    """Recompute only the attention core (QK^T, softmax, its dropout, attention over V), as
    Megatron's --recompute-granularity selective does; keep every matmul output."""
    FULL = "full"
    """Keep the layer's input only; recompute its whole forward in backward."""
    SELECTIVE_OP = "selective-op"
    """torchtitan's per-op selective checkpointing (``activation_checkpoint.mode = "selective"``,
    ``selective_ac_option = "op"``): keep the layer's input, the output of every other matmul in
    forward order (the 1st, 3rd, ...), the fused attention's outputs and the TP reduce-scatters'
    results; recompute the rest, collectives included (cost_models/op_selective.py)."""

    @property
    def reruns_forward_collectives(self) -> bool:
        """Whether backward runs the layer's forward TP, Ulysses and expert collectives again."""
        return self in (Recompute.FULL, Recompute.SELECTIVE_OP)


MEGATRON_RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
"""The recomputation Megatron-Core runs (--recompute-granularity: none, selective, full), and with
it every consumer without torchtitan's per-op policy (SELECTIVE_OP follows PyTorch's op order)."""


@dataclass(frozen=True, kw_only=True)
class Degrees:
    """The parallel degrees of one layer on its stage, by axis name. Built by
    ``LayerStrategy.degrees`` and ``Plan.vocab_degrees``; consumers ask it for group sizes
    instead of multiplying fields themselves."""

    dp: int = 1
    """Data-parallel replicas."""
    dp_type: DPType = DPType.DDP
    """How the gradient-sync group holds the model states (its ZeRO stage)."""
    tp: int = 1
    """Tensor parallel: the degree the weights are split by."""
    tp_consecutive: bool = True
    """The tp/cp/ulysses group on neighbouring ranks (True) or strided across the stage."""
    sp: SequenceParallel = SequenceParallel.NONE
    """Sequence-parallel kind: none, megatron (over tp), ulysses (over its own axis)."""
    ulysses: int = 1
    """DeepSpeed-Ulysses degree (1 unless sp is ulysses)."""
    cp: int = 1
    """Context-parallel degree: ranks splitting the sequence, attention by ring or all-gather."""
    ep: int = 1
    """Expert parallel: ranks the routed experts are split over (a view over the same ranks)."""
    etp: int = 1
    """Tensor-parallel degree of each expert's MLP (resolved: never 0)."""
    edp_type: DPType = DPType.DDP
    """How the expert data-parallel group holds the expert states."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "ulysses", "cp", "ep", "etp"):
            positive_int(getattr(self, name), name)
        for name, kind in (("dp_type", DPType), ("sp", SequenceParallel), ("edp_type", DPType)):
            object.__setattr__(self, name, member(getattr(self, name), kind, name))

    __hash__ = cached_hash  # keys the grid cache, asked for thousands of times
    __getstate__ = without_cached_hash

    @cached_property
    def gpus(self) -> int:
        """Ranks the layer spans: dp * tp * cp * ulysses."""
        return self.dp * self.split

    @cached_property
    def split(self) -> int:
        """Ranks that split one data-parallel replica's work: tp * cp * ulysses (each computes
        1 / split of the replica's FLOPs)."""
        return self.tp * self.cp * self.ulysses

    @cached_property
    def seq_split(self) -> int:
        """Degree the activations between blocks are split by along the sequence (Megatron-SP
        over tp, Ulysses over its degree, cp over its own); 1 when tokens are whole."""
        tp = self.tp if self.sp == SequenceParallel.MEGATRON else 1
        return tp * self.cp * self.ulysses

    @cached_property
    def grad_sync(self) -> int:
        """Ranks holding the same weight shard (the gradient-sync and ZeRO group):
        dp * cp * ulysses."""
        return self.dp * self.cp * self.ulysses

    @property
    def grad_sync_axes(self) -> tuple[str, ...]:
        """The axes of the gradient-sync group, for ``RankGrid.groups``."""
        return GRAD_SYNC_AXES

    @cached_property
    def edp(self) -> int:
        """Ranks holding the same expert shard: gpus / (ep * etp)."""
        return self.gpus // (self.ep * self.etp)

    def factors(self) -> str:
        """``dp(2) * tp(4) * ulysses(2)``: dp and tp always, cp and ulysses when > 1."""
        named = [("dp", self.dp), ("tp", self.tp), ("cp", self.cp), ("ulysses", self.ulysses)]
        return " * ".join(f"{n}({v})" for n, v in named if v > 1 or n in ("dp", "tp"))

    def check(self, gpus: int, where: str, stage: int) -> None:
        """The invariant, checked here only: the degrees multiply to the stage's GPUs."""
        if self.gpus != gpus:
            raise SpecError(where, f"{self.factors()} = {self.gpus} != {gpus} GPUs of stage {stage}")
