"""The framework interface: export a Plan to a training framework's own files, import them back.

``Uniform`` is a plan as Megatron, torchtitan and DeepSpeed see it (one strategy for every
layer); ``strategy_degrees``/``make_strategy`` and ``schedule_of``/``schedule_fields`` are the
only places that read or build the plan's per-layer degrees and its schedule.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping

from specs import ClusterSpec, DPType, LayerStrategy, ModelSpec, Plan, Recompute, Schedule, SequenceParallel, SpecError
from specs.axes import Degrees, EPDispatcher
from specs.files import atomic_write_text
from specs.precision import Precision
from specs.stack import SoftwareStack


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """What an export writes: file name -> text, what it assumes and what it cannot carry."""

    target: str
    """Framework name (megatron, torchtitan, deepspeed, galvatron)."""
    files: Mapping[str, str]
    """File name -> contents, each a file the framework (or its launcher) reads."""
    assumptions: tuple[str, ...] = ()
    """What the files take for granted that the plan does not say (tokenizer, data, optimizer)."""
    cannot_carry: tuple[str, ...] = ()
    """What the plan or the cost model means that the files cannot state."""

    def notes(self) -> str:
        """The assumptions and the limits as text (written as NOTES.md beside the files)."""
        lines = [f"# {self.target} export", "", "Assumes:"]
        lines += [f"- {a}" for a in self.assumptions] + ["", "Cannot carry:"]
        lines += [f"- {c}" for c in self.cannot_carry] or ["- nothing"]
        return "\n".join(lines) + "\n"

    def write(self, folder: str | Path) -> list[Path]:
        """Write every file and NOTES.md into ``folder`` (created), atomically; the paths."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in {**self.files, "NOTES.md": self.notes()}.items():
            atomic_write_text(out / name, text)
            paths.append(out / name)
        return paths


class Framework(ABC):
    """One training framework: ``export`` refuses in one SpecError line what it cannot run."""

    name: ClassVar[str] = ""
    file_names: ClassVar[tuple[str, ...]] = ()
    """The files export writes and import_ reads (the first is required on import)."""
    command_line_file: ClassVar[str | None] = None
    """The file that is a command line (Megatron's arguments): on import its flags may be given
    directly, after ``--``, instead of the file."""

    @abstractmethod
    def export(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> ExportResult:
        """The framework's files for ``plan``; SpecError naming the layer and field it cannot express."""

    @abstractmethod
    def import_(self, files: Mapping[str, str], model: ModelSpec, cluster: ClusterSpec) -> Plan:
        """The Plan the files describe for ``model`` on ``cluster``."""

    def seq_length(self, files: Mapping[str, str]) -> int | None:
        """The training sequence length the files set (None: they leave it to the model config)."""
        return None

    def check(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> None:
        """Raise the export's SpecError if ``plan`` cannot be expressed (nothing is written)."""
        self.export(plan, model, cluster)


def refuse_fp8(plan: Plan, target: str) -> None:
    """A target whose files run BF16 only refuses a plan with FP8 layers in one line, never
    writing it as BF16."""
    for i, s in enumerate(plan.layers):
        if s.precision.is_fp8:
            raise SpecError(f"layer {i}", f"precision {s.precision}: FP8 is not written to {target} files")


def refuse_tp_overlap(plan: Plan, target: str) -> None:
    """A target whose files have no TP communication overlap refuses a plan with it in one line."""
    if plan.tp_comm_overlap:
        raise SpecError("tp_comm_overlap", f"true: {target} files have no TP communication overlap")


def refuse_deepep(plan: Plan, target: str, why: str = "") -> None:
    """A target whose files cannot select DeepEP refuses a plan dispatching by it in one line."""
    if plan.ep_dispatcher != EPDispatcher.ALL_TO_ALL:
        raise SpecError("ep_dispatcher", f"{plan.ep_dispatcher}: {why or f'{target} files have no DeepEP dispatcher'}")


# -- reading the frameworks' numbers -------------------------------------------------------------
def count_of(value: Any, field: str, minimum: int = 1, special: tuple[int, ...] = ()) -> int:
    """``value`` (an integer, or its decimal text as arguments carry it) as an int >= ``minimum``
    or one of ``special`` (e.g. torchtitan's -1 for "derive it"); one SpecError line otherwise."""
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (value < minimum and value not in special):
        wanted = f"an integer >= {minimum}" + "".join(f" or {v}" for v in special)
        raise SpecError(field, f"expected {wanted}, got {value!r}")
    return value


# -- reading and building the plan's per-layer degrees and schedule -------------------------------
def strategy_degrees(s: LayerStrategy) -> Degrees:
    """The named degrees of a layer (specs.axes): weight ``tp``, ``ulysses``, ``dp``, ``grad_sync``."""
    return s.degrees


def make_strategy(*, tp: int, ulysses: int = 1, dp: int, **rest: Any) -> LayerStrategy:
    """A LayerStrategy from framework degrees (the inverse of strategy_degrees)."""
    if ulysses > 1 and tp > 1:
        raise SpecError("ulysses", f"ulysses {ulysses} together with tp {tp} has no field in hybridpar's plan")
    if ulysses > 1:
        return LayerStrategy(ulysses=ulysses, dp=dp, sp=SequenceParallel.ULYSSES, **rest)
    return LayerStrategy(tp=tp, dp=dp, **rest)


def schedule_of(plan: Plan) -> tuple[str, int]:
    """(schedule name, virtual stages per rank) as the frameworks name them: interleaving is 1F1B
    with more than one virtual stage ('1f1b', 2), not a schedule of its own."""
    if plan.schedule == Schedule.INTERLEAVED_1F1B:
        return str(Schedule.ONE_F_ONE_B), plan.virtual_stages
    return str(plan.schedule), plan.virtual_stages


def schedule_fields(schedule: str, virtual_stages: int) -> dict[str, Any]:
    """Plan keyword arguments of a schedule (the inverse of schedule_of)."""
    if virtual_stages > 1 and schedule == Schedule.ONE_F_ONE_B:
        schedule = Schedule.INTERLEAVED_1F1B
    return {"schedule": schedule, "virtual_stages": virtual_stages}


# -- the uniform view ----------------------------------------------------------------------------
DENSE_FIELDS = ("tp", "dp", "dp_type", "tp_consecutive", "recompute", "sp", "cp", "cp_comm")
EXPERT_FIELDS = ("ep", "expert_tp", "expert_dp_type")


@dataclass(frozen=True, kw_only=True)
class Uniform:
    """A plan that runs one strategy for every layer (every MoE layer one expert split)."""

    tp: int
    ulysses: int = 1
    cp: int = 1
    cp_comm: str = "p2p"
    dp: int
    pp: int = 1
    dp_type: DPType = DPType.DDP
    recompute: Recompute = Recompute.NONE
    megatron_sp: bool = False
    ep: int = 1
    expert_tp: int = 0
    """0: the layer's weight tp."""
    expert_dp_type: DPType | None = None
    stage_layers: tuple[int, ...] = ()
    chunk_layers: tuple[int, ...] = ()
    """Layers of each model chunk when a framework's split sets them (else empty: the even split)."""
    global_batch: int
    micro_batches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    vocab_tp: int = 1
    vocab_sp: SequenceParallel = SequenceParallel.NONE
    vocab_zero3: bool = False
    recompute_layers: tuple[Recompute, ...] = ()
    """Per layer, when a framework carries a per-layer recompute pattern (else empty)."""
    precision_layers: tuple[Precision, ...] = ()
    """Per layer, when a framework's files set a numeric precision (else empty: BF16)."""
    tp_comm_overlap: bool = False
    """TP communication overlap (Plan.tp_comm_overlap)."""
    ep_dispatcher: EPDispatcher = EPDispatcher.ALL_TO_ALL
    """The MoE layers' expert dispatch (Plan.ep_dispatcher)."""
    stack: SoftwareStack | None = None
    """The software stack the files state (Plan.stack; None: not stated)."""

    @property
    def micro_batch_size(self) -> int:
        return self.global_batch // (self.dp * self.micro_batches)


def uniform_view(plan: Plan, model: ModelSpec, target: str, per_layer: tuple[str, ...] = (),
                 carries_cp: bool = False) -> Uniform:
    """``plan`` as one strategy; refuses, naming the first layer and field that differ from layer 0
    (or from the first MoE layer for the expert fields), except the fields in ``per_layer``; cp
    only for a target whose files carry it (``carries_cp``)."""
    first = plan.layers[0]
    for i, s in enumerate(plan.layers):
        if s.cp > 1 and not carries_cp:
            raise SpecError(f"layer {i}", f"cp {s.cp}: context parallelism is not written to {target} files yet")
    moe = [i for i, spec in enumerate(model.layers) if spec.moe is not None]
    first_moe = plan.layers[moe[0]] if moe else first
    for i, s in enumerate(plan.layers):
        for name in DENSE_FIELDS:
            if name not in per_layer and getattr(s, name) != getattr(first, name):
                raise SpecError(f"layer {i}", f"{name} {getattr(s, name)} differs from layer 0's "
                                f"{getattr(first, name)}; {target} runs one strategy for every layer")
        if i in moe:
            for name in EXPERT_FIELDS:
                if getattr(s, name) != getattr(first_moe, name):
                    raise SpecError(f"layer {i}", f"{name} {getattr(s, name)} differs from layer {moe[0]}'s "
                                    f"{getattr(first_moe, name)}; {target} runs one expert split for every layer")
    d = strategy_degrees(first)
    schedule, v = schedule_of(plan)
    return Uniform(tp=d.tp, ulysses=d.ulysses, cp=d.cp, cp_comm=first.cp_comm, dp=d.dp, pp=plan.pp, dp_type=first.dp_type,
                   recompute=first.recompute, megatron_sp=first.megatron_sp, ep=first_moe.ep,
                   expert_tp=first_moe.expert_tp, expert_dp_type=first_moe.expert_dp_type,
                   stage_layers=plan.stage_layers, global_batch=plan.global_batch,
                   micro_batches=plan.micro_batches, schedule=schedule, virtual_stages=v,
                   vocab_tp=plan.vocab_tp, vocab_sp=plan.vocab_sp, vocab_zero3=plan.vocab_zero3,
                   recompute_layers=tuple(s.recompute for s in plan.layers) if "recompute" in per_layer else (),
                   tp_comm_overlap=plan.tp_comm_overlap, ep_dispatcher=plan.ep_dispatcher, stack=plan.stack)


def plan_from_uniform(u: Uniform, model: ModelSpec, cluster: ClusterSpec) -> Plan:
    """The Plan of ``u`` for ``model`` (expert fields on the MoE layers only), validated."""
    sharded = u.dp > 1 or u.ulysses > 1 or u.cp > 1
    sp = SequenceParallel.MEGATRON if u.megatron_sp else SequenceParallel.NONE
    base = dict(tp=u.tp, ulysses=u.ulysses, dp=u.dp, dp_type=u.dp_type if sharded else DPType.DDP)
    if u.cp > 1:
        base.update(cp=u.cp, cp_comm=u.cp_comm)
    layers = []
    for i, spec in enumerate(model.layers):
        recompute = u.recompute_layers[i] if u.recompute_layers else u.recompute
        extra = {} if u.ulysses > 1 else {"sp": sp}
        if spec.moe is not None:
            extra.update(ep=u.ep, expert_tp=u.expert_tp, expert_dp_type=u.expert_dp_type)
        if u.precision_layers:
            extra["precision"] = u.precision_layers[i]
        layers.append(make_strategy(**base, recompute=recompute, **extra))
    stages = u.stage_layers or tuple(model.num_layers // u.pp for _ in range(u.pp))
    plan = Plan(pp=u.pp, stage_layers=stages, layers=tuple(layers), global_batch=u.global_batch,
                micro_batches=u.micro_batches, vocab_tp=u.vocab_tp, vocab_sp=u.vocab_sp,
                vocab_zero3=u.vocab_zero3, model=model.name, cluster=cluster.name, chunk_layers=u.chunk_layers,
                stack=u.stack, tp_comm_overlap=u.tp_comm_overlap, ep_dispatcher=u.ep_dispatcher, **schedule_fields(u.schedule, u.virtual_stages))
    plan.validate(model, cluster)
    return plan


def vocab_sharded(dp_type: DPType, replicas: int, model: ModelSpec) -> bool:
    """The embedding and head ZeRO-3 sharded as the layers are (FSDP/ZeRO-3 wraps them too);
    hybridpar keeps a tied embedding/head matrix replicated, so never for tied models."""
    return dp_type == DPType.ZERO3 and replicas > 1 and not model.head.tied


def require_even(plan: Plan, target: str) -> None:
    """Refuse an uneven pipeline partition (the frameworks' default split is even)."""
    if len(set(plan.stage_layers)) > 1:
        raise SpecError("stage_layers", f"{list(plan.stage_layers)}: {target} splits layers evenly over stages")


def chunk_pattern(plan: Plan, target: str) -> tuple[int, int]:
    """(layers per chunk, layers the end chunks give up) of an interleaved plan: equal chunks
    (b, 0), or Megatron's with the embedding and loss counted as layers: b - 1, b ..., b - 1
    (b, 1); any other chunk layout is refused."""
    counts = plan.layers_per_chunk()
    b = counts[1] if len(counts) > 2 else counts[0]
    for ends in (0, 1):
        if counts == (b - ends,) + (b,) * (len(counts) - 2) + (b - ends,):
            return b, ends
    raise SpecError("chunk_layers", f"{list(counts)}: {target} lays out equal chunks, or the first and last "
                    "one layer short")


def with_model(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> Plan:
    """``plan`` labelled with the model and cluster names."""
    return replace(plan, model=model.name, cluster=cluster.name)


FRAMEWORKS: dict[str, Framework] = {}
"""Registered frameworks by name."""


def register(cls: type[Framework]) -> type[Framework]:
    FRAMEWORKS[cls.name] = cls()
    return cls


def get(name: str) -> Framework:
    if name not in FRAMEWORKS:
        raise SpecError("target", f"unknown framework {name!r}; choose from {', '.join(sorted(FRAMEWORKS))}")
    return FRAMEWORKS[name]


def available() -> list[str]:
    return sorted(FRAMEWORKS)

