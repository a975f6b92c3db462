"""Proof that a rank executed the plan, not only reached its numbers: what ran in one training
step (the pipeline ops per stage, each block's and each attention's forward passes, the tokens
each block's first norm saw, each layer's data-parallel collectives; its model-parallel ones are
executor.trace's), recorded inside the rank,
and --check's comparison of those records with what the plan, the schedule registry and a cost
model's prediction (peak memory, charged collectives) say."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from torch import nn
from torch.distributed.tensor import DTensor

from executor.model import Attention, Block
from specs import ModelSpec, Plan, Recompute
from specs.schedules import Op, OpKind, schedule_entry

FULL_BACKWARD = "BW"
"""Recorded kind of a backward that computes input and weight gradients at once."""

RECOMPUTED_FORWARDS = {
    # (block forwards, attention forwards) per micro-batch: full recomputation re-runs the whole
    # block in backward, selective-op too (its policy hands back what it kept), selective only the
    # attention sub-layer (its core), none nothing
    Recompute.NONE: (1, 1),
    Recompute.SELECTIVE: (1, 2),
    Recompute.FULL: (2, 2),
    Recompute.SELECTIVE_OP: (2, 2),  # the whole block again (its kept outputs handed back)
}


def _first(module: nn.Module, cls: type) -> nn.Module:
    """The outermost instance of ``cls`` inside ``module`` (wrappers such as checkpointing or
    FSDP sit around it; FSDP's class is a subclass)."""
    return next(m for m in module.modules() if isinstance(m, cls))


def _chunks(module: nn.Module) -> list[nn.Module]:
    """This rank's model chunks (one StageModule, or the children of a ChunkedStage)."""
    return list(module.children()) if not hasattr(module, "layers") else [module]


class ExecutionRecorder:
    """Hooks that record what this rank runs while ``active`` (one training step): pipeline ops
    as (kind, micro-batch, pipeline stage index), per layer the block's and the attention's
    forward calls (recomputations included) and the tokens its first norm saw."""

    def __init__(self, stage_module: nn.Module, schedule: object | None) -> None:
        self.active = False
        self.ops: list[tuple[str, int, int]] = []
        self.block_forwards: Counter[int] = Counter()
        self.attention_forwards: Counter[int] = Counter()
        self.norm_tokens: dict[int, int] = {}
        self.pipelined, self.in_op = schedule is not None, 0
        for chunk in _chunks(stage_module):
            for key, wrapped in chunk.layers.items():
                self._hook_layer(int(key), _first(wrapped, Block))
        if schedule is not None:
            stages = getattr(schedule, "_stages", None) or [schedule._stage]
            for stage in stages:
                self._wrap_stage(stage)

    def _hook_layer(self, i: int, block: Block) -> None:
        self._count(block, self.block_forwards, i)
        self._count(_first(block.attn, Attention), self.attention_forwards, i)

        def tokens(_module, args):
            if self._counts():
                x = args[0].to_local() if isinstance(args[0], DTensor) else args[0]
                self.norm_tokens[i] = int(x.shape[1])
        block.norm1.register_forward_pre_hook(tokens)

    def _counts(self) -> bool:
        """Whether a call is one to record: during the step and, under a pipeline schedule,
        inside one of its ops (torch's stage first infers its shapes by a forward of its own)."""
        return self.active and (not self.pipelined or self.in_op > 0)

    def _count(self, module: nn.Module, counter: Counter, i: int) -> None:
        def hook(_module, args):
            if self._counts():
                counter[i] += 1
        module.register_forward_pre_hook(hook)

    def _wrap_stage(self, stage) -> None:
        """Record each op the schedule runs on ``stage`` (torch's PipelineStage methods)."""
        j = stage.stage_index
        for method, kind in (("forward_one_chunk", OpKind.FORWARD), ("backward_one_chunk", OpKind.BACKWARD),
                             ("backward_weight_one_chunk", OpKind.WEIGHT)):
            setattr(stage, method, self._recording(getattr(stage, method), kind, j))

    def _recording(self, run: Callable, kind: OpKind, j: int) -> Callable:
        def wrapped(chunk_id, *args, **kwargs):
            # a full backward (torch's default; DualPipeV runs some under a split schedule) is B and W
            full = kind == OpKind.BACKWARD and kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            self.op(FULL_BACKWARD if full else kind, chunk_id, j)
            self.in_op += 1
            try:
                return run(chunk_id, *args, **kwargs)
            finally:
                self.in_op -= 1
        return wrapped

    def op(self, kind: OpKind | str, micro_batch: int, stage_index: int) -> None:
        if self.active:
            self.ops.append((str(kind), int(micro_batch), stage_index))

    def record(self) -> dict:
        """What the active step ran (plain data for the launcher)."""
        return {"ops": list(self.ops), "block_forwards": dict(self.block_forwards),
                "attention_forwards": dict(self.attention_forwards), "norm_tokens": dict(self.norm_tokens)}


def expected_ops(plan: Plan, stage: int) -> list[Op]:
    """The op order of ``stage`` in one iteration: the schedule registry's (pp > 1), or the
    gradient-accumulation loop (forward and backward of each micro-batch in turn)."""
    if plan.pp == 1:
        return [Op(kind, i, 0) for i in range(plan.micro_batches) for kind in (OpKind.FORWARD, OpKind.BACKWARD)]
    return schedule_entry(plan.schedule).ops(stage, plan.pp, plan.micro_batches, plan.virtual_stages)


def _ran_ops(plan: Plan, stage: int, ops: list[tuple[str, int, int]]) -> list[Op]:
    """Recorded ops in the registry's vocabulary: the chunk as its position on the stage, a full
    backward as B then W where the schedule splits the backward (else as B)."""
    chunks = plan.stage_chunks(stage)
    split = plan.pp > 1 and schedule_entry(plan.schedule).splits_backward
    out = []
    for kind, mb, j in ops:
        chunk = chunks.index(j) if plan.pp > 1 else 0
        kinds = ([OpKind.BACKWARD, OpKind.WEIGHT] if split else [OpKind.BACKWARD]) if kind == FULL_BACKWARD \
            else [OpKind(kind)]
        out += [Op(k, mb, chunk) for k in kinds]
    return out


def _op_text(ops: list[Op], limit: int = 12) -> str:
    text = " ".join(f"{o.kind}{o.micro_batch}" + (f".{o.chunk}" if o.chunk else "") for o in ops[:limit])
    return text + (f" ... ({len(ops)} ops)" if len(ops) > limit else "")


def schedule_errors(plan: Plan, stage: int, rank: int, record: dict) -> list[str]:
    """The op order ``rank`` ran against the registry's for its stage (one line if they differ)."""
    want, got = expected_ops(plan, stage), _ran_ops(plan, stage, record["ops"])
    if want == got:
        return []
    name = plan.schedule if plan.pp > 1 else "gradient accumulation"
    return [f"stage {stage} (rank {rank}): ran {_op_text(got)}; {name} with {plan.micro_batches} micro-batches "
            f"is {_op_text(want)}"]


def expected_tokens(plan: Plan, model: ModelSpec, i: int) -> int:
    """Tokens per sequence of layer ``i``'s first norm on one rank: the sequence split over
    Megatron-SP's tp group, Ulysses' group or the context-parallel group."""
    s = plan.layers[i]
    split = (s.tp if s.megatron_sp else 1) * s.ulysses * s.cp
    return model.layers[i].seq_len // split


def layer_errors(plan: Plan, model: ModelSpec, rank: int, record: dict) -> list[str]:
    """Per layer this rank ran: forward passes against the plan's recomputation and the tokens
    its first norm saw against the plan's sequence split."""
    errors = []
    m = plan.micro_batches
    for i in sorted(record["block_forwards"]):
        s = plan.layers[i]
        block, attention = RECOMPUTED_FORWARDS[s.recompute]
        got = (record["block_forwards"][i], record["attention_forwards"][i])
        if got != (block * m, attention * m):
            errors.append(f"layer {i} (rank {rank}): block ran forward {got[0]}x, attention {got[1]}x in a step of "
                          f"{m} micro-batches; recompute {s.recompute} means {block * m}x and {attention * m}x")
        tokens = expected_tokens(plan, model, i)
        if record["norm_tokens"].get(i) != tokens:
            errors.append(f"layer {i} (rank {rank}): norm1 saw {record['norm_tokens'].get(i)} tokens per sequence; "
                          f"{s.short()} splits the sequence to {tokens}")
    return errors


def execution_errors(plan: Plan, model: ModelSpec, per_rank: list[dict]) -> list[str]:
    """Every difference between what the ranks ran (``per_rank[r]["executed"]``) and the plan:
    schedule order per stage, forward passes and sequence split per layer, and every layer
    held by some rank."""
    errors, seen = [], set()
    for rank, result in enumerate(per_rank):
        record = result["executed"]
        errors += schedule_errors(plan, result["stage"], rank, record)
        errors += layer_errors(plan, model, rank, record)
        seen.update(record["block_forwards"])
    missing = sorted(set(range(len(plan.layers))) - seen)
    if missing:
        errors.append(f"layers {missing} ran on no rank")
    return errors


MEMORY_RTOL_CPU = 0.35
"""How far a rank's measured peak (MemTracker, CPU) may exceed the predicted one. Seen on
tiny-gpt over 2 ranks in bf16 against the analytical model: -11 % (ZeRO-3) to +31 % (full
recomputation, whose saving the small model's peak does not show); weights not split over tp
read +68 %, ZeRO-1 run as DDP +61 %."""


def memory_errors(plan: Plan, measured_bytes: tuple[int, ...], predicted_bytes: tuple[float, ...],
                  rtol: float = MEMORY_RTOL_CPU) -> list[str]:
    """Ranks whose measured peak exceeds the prediction by more than ``rtol`` (one line each)."""
    per_stage = len(measured_bytes) // plan.pp
    errors = []
    for rank, (got, want) in enumerate(zip(measured_bytes, predicted_bytes)):
        if got > want * (1 + rtol):
            stage = rank // per_stage
            layers = ", ".join(dict.fromkeys(plan.layers[i].short() for i in plan.stage_ranges()[stage]))
            errors.append(f"rank {rank} (stage {stage}: {layers}): peak {got / 2**20:.1f} MiB, predicted "
                          f"{want / 2**20:.1f} MiB ({got / want - 1:+.0%}, tolerance +{rtol:.0%}): a memory-saving "
                          f"choice of the stage was not applied")
    return errors


@dataclass(frozen=True, kw_only=True)
class CostPrediction:
    """What a cost model says of a plan, for --check to hold the run to (the executor imports no
    cost model: the caller passes one's)."""

    peak_bytes: tuple[float, ...] | None = None
    """Per rank: the predicted peak memory (runtime overhead removed); None: not checked."""
    collectives: tuple | None = None
    """The collectives charged (``cost_models.charged.ChargedCollective`` rows: layer, part, op,
    group_axes, group_size, elements, calls, difference): data-parallel ones per layer part,
    model-parallel ones (parts model_parallel, pipeline) if listed, e.g. by
    ``cost_models.expected_collectives``; None: not checked."""


COLLECTIVE_RTOL = 0.02
"""Elements per call may differ by this share (plus one per rank of the group, for the flat
buffer's padding): the cost model splits the whole layer by tp, the executor keeps norms and
row-parallel biases whole (0.4 % of a tiny-gpt block at tp 2)."""


def unit_traces(units: list) -> dict[str, list[tuple[str, int, int]]]:
    """Per unit, the data-parallel collectives it ran since the gradients were last zeroed (its
    bucket's or FSDP module's)."""
    return {u.name: list(u.trace) for u in units if u.trace is not None}


TIED_UNIT = "tied embedding"
"""The data-parallel unit of the tied word-embedding matrix (executor.parallelize)."""


def part_key(unit_name: str) -> tuple[int, str] | None:
    """(layer, part) of a layer unit ("layer 3" -> (3, "dense"), "layer 3 experts" -> (3, "experts"))."""
    words = unit_name.split()
    if words[0] != "layer":
        return None
    return int(words[1]), ("experts" if words[-1] == "experts" else "dense")


def _calls_text(calls: dict[str, tuple[int, float, int]]) -> str:
    return ", ".join(f"{op} x{n} of {elements:.0f} elements over {size} ranks"
                     for op, (n, elements, size) in sorted(calls.items())) or "none"


def _ran(trace: list[tuple[str, int, int]]) -> dict[str, tuple[int, float, int]]:
    out: dict[str, tuple[int, float, int]] = {}
    for op, elements, size in trace:
        n = out.get(op, (0, 0, 0))[0]
        out[op] = (n + 1, max(elements, out.get(op, (0, 0, 0))[1]), size)
    return out


def _same(ran: dict, charged: dict) -> bool:
    if set(ran) != set(charged):
        return False
    return all(ran[op][0] == charged[op][0] and ran[op][2] == charged[op][2]
               and abs(ran[op][1] - charged[op][1]) <= COLLECTIVE_RTOL * charged[op][1] + ran[op][2]
               for op in ran)


MODEL_PARALLEL_PARTS = {"model_parallel": "layer {}", "pipeline": "boundary {}", "expert_dispatch": "layer {} experts",
                        "relayout": "relayout {}", "embedding": "embedding", "head": "head", "loss": "loss"}
"""Charged rows' parts that are model-parallel traffic -> the key of their trace records
(executor.trace: "layer 3", "boundary 1", "layer 3 experts", "relayout 3"...)."""
UNCOMPARED = "outside layers"
"""The trace's key for what ran outside every watched module (an interleaved pipeline's sends)."""
ROUTED = " experts"
"""Keys ending so hold a MoE's routed rows, whose sizes per rank follow the routing: each rank's
calls per kind and group size are compared, their elements as the ranks' total."""


def _mp_calls(records, routed: bool = False) -> dict[str, Counter]:
    """Per kind: calls per (elements, group size); ``routed``: per (0, group size)."""
    out: dict[str, Counter] = {}
    for op, elements, size in records:
        out.setdefault(str(op), Counter())[(0 if routed else int(round(elements)), int(size))] += 1
    return out


def _mp_text(calls: Counter) -> str:
    return ", ".join(f"x{n} of {e} elements over {size} ranks" if e else f"x{n} over {size} ranks"
                     for (e, size), n in sorted(calls.items())) or "none"


def _charged_by_key(charged: tuple) -> tuple[dict[str, list], dict[tuple[str, str], str]]:
    """The model-parallel rows as trace records per key, and the documented difference per (key, kind)."""
    want: dict[str, list] = {}
    notes: dict[tuple[str, str], str] = {}
    for row in charged:
        form = MODEL_PARALLEL_PARTS.get(str(row.part))
        if form is None:
            continue
        key = form.format(row.layer)
        want.setdefault(key, []).extend([(str(row.op), row.elements, row.group_size)] * row.calls)
        if getattr(row, "difference", ""):
            notes[(key, str(row.op))] = row.difference
    return want, notes


def model_parallel_errors(per_rank: list[dict], charged: tuple) -> list[str]:
    """Per rank, key (layer, its experts, stage boundary, relayout, embedding, head, loss) and
    kind: the model-parallel collectives the rank ran in the last step
    (``per_rank[r]["model_parallel"]``, executor.trace) against the rows of ``charged`` for
    it: calls, elements and group size; one line per kind that differs. A MoE's routed rows
    (keys ending " experts") are held per rank to calls and group sizes and, over the ranks
    that ran them, to the charged elements in total. Rows carrying a ``difference`` are the
    executor's documented differences from the cost model."""
    want, notes = _charged_by_key(charged)
    errors = []
    totals: dict[tuple[str, str], list[float]] = {}  # (key, kind) -> [ran, charged, ranks]
    for rank, result in enumerate(per_rank):
        for key, records in result.get("model_parallel", {}).items():
            if key == UNCOMPARED:
                continue
            routed = key.endswith(ROUTED)
            ran, charges = _mp_calls(records, routed), _mp_calls(want.get(key, []), routed)
            for op in sorted(set(ran) | set(charges)):
                note = f" (as the executor runs it: {notes[(key, op)]})" if (key, op) in notes else ""
                if ran.get(op, Counter()) != charges.get(op, Counter()):
                    errors.append(f"{key} (rank {rank}): {op} ran {_mp_text(ran.get(op, Counter()))}; the cost model "
                                  f"charges {_mp_text(charges.get(op, Counter()))}{note}")
                elif routed:
                    total = totals.setdefault((key, op), [0.0, 0.0, 0])
                    total[0] += sum(e for o, e, _ in records if o == op)
                    total[1] += sum(e for o, e, _ in want[key] if o == op)
                    total[2] += 1
    for (key, op), (ran_elements, charged_elements, ranks) in totals.items():
        if abs(ran_elements - charged_elements) > COLLECTIVE_RTOL * charged_elements:
            errors.append(f"{key} ({ranks} ranks): {op} moved {ran_elements:.0f} elements in all; the cost model "
                          f"charges {charged_elements:.0f} (routed rows, compared as the ranks' total)")
    return errors


def collective_errors(plan: Plan, per_rank: list[dict], charged: tuple) -> list[str]:
    """Per rank and layer part (``per_rank[r]["collectives"]``: the last step's): kinds, calls,
    group sizes and elements against the cost model's ``charged`` rows, and the tied embedding's
    unit where ``charged`` lists its sync (``cost_models.charged_collectives`` and
    ``expected_collectives`` do, the data-parallel rows alone do not); then the model-parallel
    ones (model_parallel_errors)."""
    tied = any(str(row.part) == "tied_embedding" for row in charged)
    want: dict[tuple[int, str], dict[str, tuple[int, float, int]]] = {}
    for row in charged:
        if str(row.part) in MODEL_PARALLEL_PARTS:
            continue
        want.setdefault((row.layer, str(row.part)), {})[str(row.op)] = (row.calls, row.elements, row.group_size)
    errors = []
    for rank, result in enumerate(per_rank):
        for name, trace in result["collectives"].items():
            key = (0, "tied_embedding") if name == TIED_UNIT and tied else part_key(name)
            if key is None:  # the embedding's and the head's own units: not compared
                continue
            ran, charges = _ran(trace), want.get(key, {})
            if not _same(ran, charges):
                errors.append(f"{name} (rank {rank}): ran {_calls_text(ran)}; the cost model charges "
                              f"{_calls_text(charges)}")
    return errors + (model_parallel_errors(per_rank, charged) if _lists_model_parallel(charged) else [])


def _lists_model_parallel(charged: tuple) -> bool:
    """Whether ``charged`` speaks of model parallelism (lists a model-parallel row): data-parallel
    rows alone (``cost_models.charged_dp_collectives``) leave the model-parallel trace unchecked."""
    return any(str(row.part) in MODEL_PARALLEL_PARTS for row in charged)
