"""torchtitan job config for a plan: the TOML sections of its train configs, and the same settings
as the command-line overrides its ConfigManager parses (``--parallelism.tensor_parallel_degree 8``);
and the way back from either to a Plan."""
from __future__ import annotations

import math
import shlex
import tomllib
from dataclasses import replace
from typing import Any, Mapping

from frameworks.base import (ExportResult, Framework, Uniform, chunk_pattern, count_of, plan_from_uniform, refuse_deepep,
                             refuse_fp8,
                             register, require_even,
                             uniform_view, vocab_sharded)
from specs import ClusterSpec, DPType, ModelSpec, Plan, Recompute, SequenceParallel, SpecError, stage_sums
from specs.schedules import REGISTRY, PipelineSchedule, Schedule
from specs.stack import SoftwareStack

TOML_FILE = "torchtitan.toml"
ARGS_FILE = "torchtitan_args.txt"

SINGLE_STAGE = ("GPipe", "1F1B")
"""torchtitan's schedules of one stage per rank (torch's PipelineScheduleSingle); the others
(PipelineScheduleMulti) need at least 2 stages per rank."""


def _torch_name(entry: PipelineSchedule) -> str:
    """The schedule's torch.distributed.pipelining class less "Schedule" (get_schedule_class's name)."""
    return entry.torch_class.removeprefix("Schedule")


def torchtitan_name(entry: PipelineSchedule) -> str | None:
    """The ``pipeline_parallel_schedule`` that runs ``entry``: its torch.distributed.pipelining
    class name less "Schedule" (what torch's get_schedule_class reads), or None where torchtitan's
    stages per rank rule out the schedule's chunks per rank (ZB-H1 is torch's InterleavedZeroBubble
    with one stage per rank, which torchtitan refuses)."""
    name = _torch_name(entry)
    fits = entry.max_virtual_stages == 1 if name in SINGLE_STAGE else entry.min_virtual_stages >= 2
    return name if fits else None


SCHEDULES: dict[Schedule, str] = {s: n for s, e in REGISTRY.items() if (n := torchtitan_name(e)) is not None}
"""hybridpar schedule -> torchtitan's pipeline_parallel_schedule, for every schedule torchtitan runs."""
FROM_TORCHTITAN = {n.lower(): s for s, n in SCHEDULES.items()}
"""The way back, by lower-case name (torch matches schedule names case-insensitively)."""
RESHARD = {DPType.ZERO3: "always", DPType.ZERO2: "never"}
AC_MODES = {Recompute.NONE: "none", Recompute.FULL: "full", Recompute.SELECTIVE_OP: "selective"}
"""hybridpar recompute -> torchtitan's activation_checkpoint mode (its "selective" is the per-op
policy: selective_ac_option "op" in the TOML configs, the only selective AC from 0.3.0 on)."""
OP_OPTION = "op"
"""The TOML configs' selective_ac_option of the per-op policy (a number: every N-th layer in full)."""
MODULES = {"llama3-8b": ("llama3", "llama3_8b", "8B"), "llama3-70b": ("llama3", "llama3_70b", "70B")}
"""Zoo model -> (torchtitan --module, --config, TOML model flavor)."""

ASSUMES = (
    "model: torchtitan's registered model of the same architecture (--module/--config, or [model] "
    "name/flavor in the TOML); other zoo models need their own registration",
    "tokenizer and data: the recipe's own (hf_assets_path, dataset c4)",
    "optimizer: AdamW; FSDP mixed precision bf16 parameters, fp32 gradient reduction",
    "pipeline: layers split evenly, the embedding and the head not counted as layers "
    "(first/last_stage_less_layers 0, or 1 where the plan's end chunks are one layer short)",
)
CANNOT_CARRY = (
    "selective recompute (Megatron's attention core): torchtitan's selective AC is its per-op save policy, "
    "which plans state as selective-op; plans with Megatron's selective are refused",
    "HSDP (replicate x shard): hybridpar's plan has one data-parallel flavour over the whole dp group",
    "the cost model's overlap and efficiency assumptions (float8 changes the time); torch.compile is enabled "
    "exactly when the plan's stack is compile, whose kernels its times assume, and async TP when the plan's "
    "tp_comm_overlap is on",
)


def _check(plan: Plan, model: ModelSpec) -> Uniform:
    refuse_deepep(plan, "torchtitan", "torchtitan selects DeepEP in the model's registration (its MoE config's "
                  "moe_comm_backend), not in the job config written here")
    u = uniform_view(plan, model, "torchtitan")
    s = plan.layers[0]
    if u.ulysses > 1 or plan.vocab_sp == SequenceParallel.ULYSSES:
        raise SpecError("layer 0", "sp ulysses: torchtitan's context parallelism is ring attention, not Ulysses")
    if u.dp_type == DPType.ZERO1 and s.degrees.grad_sync > 1:
        raise SpecError("layer 0", "dp_type zero1: torchtitan runs DDP (replicate) or FSDP2 (zero3, zero2 with "
                        "reshard_after_forward never), not ZeRO-1")
    if u.recompute not in AC_MODES:
        raise SpecError("layer 0", f"recompute {u.recompute}: torchtitan's selective AC is its per-op policy "
                        "(selective-op), not Megatron's attention-core recompute")
    if s.tp > 1 and s.dp > 1 and not s.tp_consecutive:
        raise SpecError("layer 0", "tp_consecutive false: torchtitan's mesh puts tp innermost")
    if u.ep > 1 and (u.expert_tp or u.tp) != 1:
        raise SpecError("layer 0", f"expert_tp {u.expert_tp or u.tp}: torchtitan's expert parallelism keeps "
                        "experts whole (expert tp 1)")
    if u.ep > 1 and u.expert_dp_type not in (None, u.dp_type):
        raise SpecError("layer 0", f"expert_dp_type {u.expert_dp_type}: torchtitan shards experts like the rest")
    if plan.schedule not in SCHEDULES:
        torch_name = _torch_name(REGISTRY[plan.schedule])
        stages = "1 stage" if torch_name in SINGLE_STAGE else "2 or more stages"
        raise SpecError("schedule", f"{plan.schedule} has no torchtitan schedule (torchtitan runs {torch_name} with "
                        f"{stages} per rank, {plan.schedule} {plan.virtual_stages}; it reads "
                        f"{', '.join(SCHEDULES.values())})")
    if u.virtual_stages == 1:
        require_even(plan, "torchtitan")
    else:
        chunk_pattern(plan, "torchtitan")
    zero3 = vocab_sharded(u.dp_type, u.dp, model)
    sp = SequenceParallel.MEGATRON if u.megatron_sp else SequenceParallel.NONE
    if u.tp_comm_overlap and plan.stack != SoftwareStack.COMPILE:
        raise SpecError("tp_comm_overlap", f"true under stack {plan.stack}: torchtitan's async TP needs "
                        "torch.compile (stack compile)")
    if plan.vocab_tp != u.tp or plan.vocab_sp != sp or plan.vocab_zero3 != zero3:
        raise SpecError("vocab_tp", f"vocab tp {plan.vocab_tp} sp {plan.vocab_sp} zero3 {plan.vocab_zero3}: "
                        f"torchtitan shards the embedding and head like the layers (tp {u.tp}, sp {sp}, "
                        f"zero3 {zero3})")
    return u


def settings(plan: Plan, model: ModelSpec) -> dict[str, dict[str, Any]]:
    """The plan as torchtitan config sections: {"parallelism": {...}, "training": {...}, ...}."""
    u = _check(plan, model)
    shard = u.dp if u.dp_type in (DPType.ZERO2, DPType.ZERO3) else 1
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": u.dp // shard, "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": u.tp, "enable_sequence_parallel": u.megatron_sp,
        "pipeline_parallel_degree": u.pp, "context_parallel_degree": 1,
    }
    if shard > 1:
        par["fsdp_reshard_after_forward"] = RESHARD[u.dp_type]
    if any(spec.moe is not None for spec in model.layers):
        par["expert_parallel_degree"] = u.ep
    per_replica = u.global_batch // u.dp
    training: dict[str, Any] = {"global_batch_size": u.global_batch, "seq_len": model.seq_len,
                                "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"}
    if u.pp > 1:  # the micro-batches are the pipeline's; no gradient accumulation
        per_chunk, ends = chunk_pattern(plan, "torchtitan") if u.virtual_stages > 1 else (model.num_layers // u.pp, 0)
        par.update(pipeline_parallel_schedule=SCHEDULES[plan.schedule],
                   pipeline_parallel_microbatch_size=u.micro_batch_size,
                   pipeline_parallel_layers_per_stage=per_chunk,
                   pipeline_parallel_first_stage_less_layers=ends, pipeline_parallel_last_stage_less_layers=ends)
        training.update(local_batch_size=per_replica, disable_cuda_graphs=True)
    else:  # the micro-batches are gradient-accumulation steps
        training["local_batch_size"] = u.micro_batch_size
    ac: dict[str, Any] = {"mode": AC_MODES[u.recompute]}
    if u.recompute == Recompute.SELECTIVE_OP:
        ac["selective_ac_option"] = OP_OPTION
    sections = {"parallelism": par, "training": training, "activation_checkpoint": ac}
    if plan.stack == SoftwareStack.COMPILE:  # the kernels the plan's times assume
        sections["compile"] = {"enable": True}
    if u.tp_comm_overlap:  # async TP: Inductor's micro-pipelined collective matmuls (_check: under compile)
        sections["compile"]["enable_async_tensor_parallel"] = True
    return sections


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


def toml_text(sections: Mapping[str, Mapping[str, Any]], model: ModelSpec, summary: str) -> str:
    lines = [f"# torchtitan job config written by hybridpar for {model.name}: {summary}"]
    if model.name in MODULES:
        lines += ["", "[model]", 'name = "llama3"', f'flavor = "{MODULES[model.name][2]}"']
    for name, items in sections.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in items.items()]
    return "\n".join(lines) + "\n"


def args_text(sections: Mapping[str, Mapping[str, Any]], model: ModelSpec) -> str:
    """The command-line form torchtitan's ConfigManager (tyro) parses: ``--section.key value``,
    booleans as ``--section.key`` / ``--section.no-key``, activation checkpointing as its
    ``activation-checkpoint:MODE`` subcommand, which comes last."""
    module, config, _ = MODULES.get(model.name, ("MODULE", "CONFIG", ""))
    lines = [f"--module {module} --config {config}"]
    for name, items in sections.items():
        if name == "activation_checkpoint":
            continue
        for k, v in items.items():
            flag = k.replace("_", "-")
            lines.append(f"--{name}.{flag if v else 'no-' + flag}" if isinstance(v, bool) else f"--{name}.{k} {v}")
    lines.append(f"activation-checkpoint:{sections['activation_checkpoint']['mode']}")
    return "\n".join(lines) + "\n"


@register
class Torchtitan(Framework):
    """torchtitan (FSDP2/DDP, DTensor TP with sequence parallelism, torch.distributed.pipelining)."""

    name = "torchtitan"
    file_names = (TOML_FILE, ARGS_FILE)

    def export(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> ExportResult:
        refuse_fp8(plan, "torchtitan")
        sections = settings(plan, model)
        return ExportResult(target=self.name, files={TOML_FILE: toml_text(sections, model, plan.summary()),
                                                     ARGS_FILE: args_text(sections, model)},
                            assumptions=ASSUMES, cannot_carry=CANNOT_CARRY)

    def import_(self, files: Mapping[str, str], model: ModelSpec, cluster: ClusterSpec) -> Plan:
        return plan_from_sections(read_sections(files), model, cluster)

    def seq_length(self, files: Mapping[str, str]) -> int | None:
        value = read_sections(files).get("training", {}).get("seq_len")
        return None if value is None else int(value)


def read_sections(files: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The TOML (or the command-line overrides) as {section: {key: value}}."""
    if TOML_FILE in files:
        try:
            return tomllib.loads(files[TOML_FILE])
        except tomllib.TOMLDecodeError as err:
            raise SpecError(TOML_FILE, f"not TOML: {err}") from None
    if ARGS_FILE not in files:
        raise SpecError("files", f"give {TOML_FILE} or {ARGS_FILE}")
    out: dict[str, dict[str, Any]] = {}
    try:
        tokens = shlex.split(files[ARGS_FILE], comments=True)
    except ValueError as err:  # an unclosed quote, a trailing escape
        raise SpecError(ARGS_FILE, f"cannot split into words: {err}") from None
    for i, tok in enumerate(tokens):
        if tok.startswith("activation-checkpoint:"):
            out.setdefault("activation_checkpoint", {})["mode"] = tok.partition(":")[2]
        elif tok.startswith("--") and "." in tok:
            section, _, key = tok[2:].partition(".")
            value: Any = True
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("-") and ":" not in tokens[i + 1]:
                value = _scalar(tokens[i + 1])
            elif key.startswith("no-"):
                key, value = key[3:], False
            out.setdefault(section, {})[key.replace("-", "_")] = value
    return out


def _scalar(text: str) -> Any:
    if text in ("true", "True", "false", "False"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


AUTO_KEYS = ("data_parallel_shard_degree", "global_batch_size")
"""Keys where -1 means "derive it from the others"."""
ZERO_KEYS = ("pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
             "pipeline_parallel_last_stage_less_layers")
"""Keys where 0 is a value."""


def _get(section: Mapping[str, Any], key: str, default: Any, name: str) -> int:
    value = section.get(key, default)
    if isinstance(value, str):  # TOML keeps integers apart from text
        raise SpecError(f"{name}.{key}", f"expected an integer, got {value!r}")
    return count_of(value, f"{name}.{key}", 0 if key in ZERO_KEYS else 1, (-1,) if key in AUTO_KEYS else ())


def _table(sections: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The ``[name]`` table of the job config ({} when absent)."""
    table = sections.get(name, {})
    if not isinstance(table, Mapping):
        raise SpecError(name, f"expected a table, got {table!r}")
    return table


def plan_from_sections(sections: Mapping[str, Any], model: ModelSpec, cluster: ClusterSpec) -> Plan:
    par, training = _table(sections, "parallelism"), _table(sections, "training")
    tp, pp = _get(par, "tensor_parallel_degree", 1, "parallelism"), _get(par, "pipeline_parallel_degree", 1, "parallelism")
    if _get(par, "context_parallel_degree", 1, "parallelism") != 1:
        raise SpecError("parallelism.context_parallel_degree", "context parallelism has no field in hybridpar's plan")
    if "seq_len" in training and training["seq_len"] != model.seq_len:
        raise SpecError("training.seq_len", f"{training['seq_len']} but the model is built for seq {model.seq_len}")
    replicate = _get(par, "data_parallel_replicate_degree", 1, "parallelism")
    shard = _get(par, "data_parallel_shard_degree", -1, "parallelism")
    if shard == -1:
        shard = cluster.world_size // (replicate * tp * pp)
    if replicate * shard * tp * pp != cluster.world_size:
        raise SpecError("parallelism", f"replicate({replicate})*shard({shard})*tp({tp})*pp({pp}) != "
                        f"world({cluster.world_size})")
    if replicate > 1 and shard > 1:
        raise SpecError("parallelism.data_parallel_replicate_degree", f"HSDP {replicate} x {shard} has no field "
                        "in hybridpar's plan (one data-parallel flavour over the whole dp group)")
    dp = replicate * shard
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if not isinstance(reshard, str) or reshard not in ("default", "always", "never"):
        raise SpecError("parallelism.fsdp_reshard_after_forward", f"expected default, always or never, got {reshard!r}")
    dp_type = DPType.DDP if shard == 1 else {"always": DPType.ZERO3, "never": DPType.ZERO2}.get(
        reshard, DPType.ZERO2 if pp > 1 else DPType.ZERO3)  # default: no resharding under pp
    local = _get(training, "local_batch_size", 8, "training")
    global_batch = _get(training, "global_batch_size", -1, "training")
    global_batch = local * dp if global_batch == -1 else global_batch
    if global_batch % (local * dp):
        raise SpecError("training.global_batch_size", f"{global_batch} is not a multiple of local batch {local} * dp {dp}")
    steps = global_batch // (local * dp)  # gradient accumulation
    micro, v, schedule, stages, chunks = steps, 1, "1f1b", (model.num_layers,), ()
    if pp > 1:
        mbs = _get(par, "pipeline_parallel_microbatch_size", 1, "parallelism")
        if local % mbs:
            raise SpecError("parallelism.pipeline_parallel_microbatch_size", f"{mbs} does not divide local batch {local}")
        micro = steps * (local // mbs)
        schedule, v, stages, chunks = _pipeline(par, model, pp)
    recompute = _recompute(_table(sections, "activation_checkpoint"))
    sp = par.get("enable_sequence_parallel", True) and tp > 1
    overlap = _async_tp(sections, par)
    u = Uniform(tp=tp, dp=dp, pp=pp, dp_type=dp_type, recompute=recompute, megatron_sp=sp,
                ep=_get(par, "expert_parallel_degree", 1, "parallelism"), global_batch=global_batch,
                micro_batches=micro, schedule=schedule, virtual_stages=v, vocab_tp=tp, stage_layers=stages,
                chunk_layers=chunks,
                vocab_sp=SequenceParallel.MEGATRON if sp else SequenceParallel.NONE,
                vocab_zero3=vocab_sharded(dp_type, dp, model), tp_comm_overlap=overlap,
                stack=SoftwareStack.COMPILE if overlap else None)
    if u.ep > 1:
        u = replace(u, expert_tp=1 if tp > 1 else 0)
    return plan_from_uniform(u, model, cluster)


def _async_tp(sections: Mapping[str, Any], par: Mapping[str, Any]) -> bool:
    """``compile.enable_async_tensor_parallel`` (``parallelism.`` in torchtitan releases before the
    key moved), which torchtitan runs only under ``compile.enable``."""
    compile_ = _table(sections, "compile")
    key = next((k for k, table in (("compile", compile_), ("parallelism", par))
                if table.get("enable_async_tensor_parallel", False) is True), None)
    if key is None:
        return False
    if compile_.get("enable", False) is not True:
        raise SpecError(f"{key}.enable_async_tensor_parallel", "true needs compile.enable true "
                        "(torchtitan's async TP runs under torch.compile)")
    return True


def _recompute(ac: Mapping[str, Any]) -> Recompute:
    """The [activation_checkpoint] table as a recompute: none, full, or selective with the per-op
    option (or none given, as from 0.3.0 on); selective every N-th layer is not one kind per layer."""
    mode = ac.get("mode", "none")
    recompute = {m: r for r, m in AC_MODES.items()}.get(mode) if isinstance(mode, str) else None
    if recompute is None:
        raise SpecError("activation_checkpoint.mode", f"{mode!r}: hybridpar reads none, full or selective")
    option = ac.get("selective_ac_option", OP_OPTION)
    if recompute == Recompute.SELECTIVE_OP and option != OP_OPTION:
        raise SpecError("activation_checkpoint.selective_ac_option", f"{option!r}: every N-th layer recomputed in "
                        f"full is not one recompute for every layer; hybridpar reads {OP_OPTION!r}")
    return recompute


def _pipeline(par: Mapping[str, Any], model: ModelSpec,
              pp: int) -> tuple[str, int, tuple[int, ...], tuple[int, ...]]:
    """(schedule, virtual stages, layers per stage, layers per chunk) as torchtitan splits the
    model: a one-stage schedule over pp stages; the others over ceil((layers + first less + last
    less) / layers_per_stage) stages (2 per rank without it), placed as the schedule places its
    chunks (round-robin, or a V for ZBVZeroBubble and DualPipeV)."""
    name = par.get("pipeline_parallel_schedule", "1F1B")
    schedule = FROM_TORCHTITAN.get(name.lower()) if isinstance(name, str) else None
    if schedule is None:
        raise SpecError("parallelism.pipeline_parallel_schedule", f"{name!r}: hybridpar reads "
                        f"{', '.join(SCHEDULES.values())}")
    first = _get(par, "pipeline_parallel_first_stage_less_layers", 1, "parallelism")
    last = _get(par, "pipeline_parallel_last_stage_less_layers", 1, "parallelism")
    entry = REGISTRY[schedule]
    if entry.max_virtual_stages == 1:
        return schedule, 1, torchtitan_split(model.num_layers, pp, first, last), ()
    per_chunk = _get(par, "pipeline_parallel_layers_per_stage", 0, "parallelism")
    total = math.ceil((model.num_layers + first + last) / per_chunk) if per_chunk else 2 * pp
    if total % pp:
        raise SpecError("parallelism.pipeline_parallel_layers_per_stage", f"{per_chunk} (first/last less "
                        f"{first}/{last}) makes {total} stages of {model.num_layers} layers, not a multiple of pp {pp}")
    v = total // pp
    chunks = torchtitan_split(model.num_layers, total, first, last)
    return schedule, v, stage_sums(chunks, pp, v, schedule), chunks


def torchtitan_split(num_layers: int, stages: int, first_less: int, last_less: int) -> tuple[int, ...]:
    """Layers per stage as torchtitan splits them: the embedding counts as ``first_less`` layers on
    the first stage and the head as ``last_less`` on the last, the sum spread evenly (the first
    stages take one more); the first and last stage may be left with the embedding or the head
    alone, as torchtitan allows."""
    base, extra = divmod(num_layers + first_less + last_less, stages)
    out = [base + (1 if i < extra else 0) for i in range(stages)]
    out[0] -= first_less
    out[-1] -= last_less
    if min(out[1:-1], default=1) < 1 or min(out[0], out[-1]) < 0 or sum(out) != num_layers:
        raise SpecError("parallelism.pipeline_parallel_degree", f"{stages} stages leave a stage without layers")
    return tuple(out)
