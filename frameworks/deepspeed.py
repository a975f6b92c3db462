"""DeepSpeed config JSON (ZeRO stage, batch sizes, bf16, activation checkpointing) with the
Megatron-DeepSpeed launcher degrees (tp, pp, Ulysses) for a plan, and the way back."""
from __future__ import annotations

import json
from typing import Any, Mapping

from frameworks.base import (ExportResult, Framework, Uniform, count_of, plan_from_uniform, refuse_fp8,
                             refuse_deepep, refuse_tp_overlap, register, require_even, uniform_view, vocab_sharded)
from frameworks.megatron import args_text, parse_args_text
from specs import ClusterSpec, DPType, ModelSpec, Plan, Recompute, SequenceParallel, SpecError
from specs.reader import parse_json_text

CONFIG_FILE = "ds_config.json"
ARGS_FILE = "megatron_deepspeed_args.txt"
STAGES = {DPType.DDP: 0, DPType.ZERO1: 1, DPType.ZERO2: 2, DPType.ZERO3: 3}

ASSUMES = (
    "launcher: Megatron-DeepSpeed's pretrain_gpt.py reads the degrees in megatron_deepspeed_args.txt "
    "and the JSON (--deepspeed --deepspeed_config ds_config.json)",
    "tokenizer and data: --mock-data-like placeholders; give your tokenizer and --data-path",
    "optimizer: DeepSpeed's fused Adam in bf16 mixed precision (fp32 master weights and states)",
    "pipeline: DeepSpeed's PipelineModule with partition_method uniform (an even split of the layers)",
)
CANNOT_CARRY = (
    "expert parallelism (DeepSpeed-MoE's ep_size lives in the model code, not the config); plans with ep > 1 "
    "are refused",
    "selective recompute and interleaved pipelines (DeepSpeed's pipeline engine runs one 1F1B schedule)",
    "the cost model's overlap assumptions (overlap_comm, contiguous_gradients and bucket sizes change the time)",
)


def _check(plan: Plan, model: ModelSpec) -> Uniform:
    u = uniform_view(plan, model, "DeepSpeed")
    s = plan.layers[0]
    if u.pp > 1 and u.dp_type in (DPType.ZERO2, DPType.ZERO3) and s.degrees.grad_sync > 1:
        raise SpecError("layer 0", f"dp_type {u.dp_type} with pp {u.pp}: DeepSpeed's pipeline engine runs "
                        "ZeRO stage 0 or 1 only")
    if u.recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP):
        raise SpecError("layer 0", f"recompute {u.recompute}: DeepSpeed checkpoints whole layers (full) or none")
    if u.ep > 1 or u.expert_tp:
        raise SpecError("layer 0", f"ep {u.ep}: expert parallelism is not written to DeepSpeed configs")
    if s.tp > 1 and s.dp > 1 and not s.tp_consecutive:
        raise SpecError("layer 0", "tp_consecutive false: Megatron-DeepSpeed puts tp on neighbouring ranks")
    if plan.schedule != "1f1b" or plan.virtual_stages > 1:
        raise SpecError("schedule", f"{plan.schedule} v{plan.virtual_stages}: DeepSpeed's pipeline engine runs 1F1B")
    require_even(plan, "DeepSpeed")
    degree = u.ulysses if u.ulysses > 1 else u.tp
    zero3 = vocab_sharded(u.dp_type, s.degrees.grad_sync, model)
    if plan.vocab_tp != degree or plan.vocab_sp != s.sp or plan.vocab_zero3 != zero3:
        raise SpecError("vocab_tp", f"vocab tp {plan.vocab_tp} sp {plan.vocab_sp} zero3 {plan.vocab_zero3}: "
                        f"Megatron-DeepSpeed splits the embedding and head like the layers (tp {degree}, "
                        f"sp {s.sp}, zero3 {zero3})")
    return u


def ds_config(u: Uniform) -> dict[str, Any]:
    """DeepSpeed's JSON: train_batch_size = micro batch * accumulation * dp."""
    out: dict[str, Any] = {
        "train_batch_size": u.global_batch, "train_micro_batch_size_per_gpu": u.micro_batch_size,
        "gradient_accumulation_steps": u.micro_batches, "bf16": {"enabled": True},
        "zero_optimization": {"stage": STAGES[u.dp_type] if u.dp > 1 or u.ulysses > 1 else 0},
        "gradient_clipping": 1.0, "steps_per_print": 10,
    }
    if u.recompute == Recompute.FULL:
        out["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    return out


def launcher_args(u: Uniform, model: ModelSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"tensor_model_parallel_size": u.tp, "pipeline_model_parallel_size": u.pp,
                           "ds_sequence_parallel_size": u.ulysses, "sequence_parallel": u.megatron_sp,
                           "no_pipeline_parallel": u.pp == 1, "micro_batch_size": u.micro_batch_size,
                           "global_batch_size": u.global_batch, "seq_length": model.seq_len,
                           "num_layers": model.num_layers, "zero_stage": ds_config(u)["zero_optimization"]["stage"],
                           "checkpoint_activations": u.recompute == Recompute.FULL, "bf16": True,
                           "deepspeed": True, "deepspeed_config": CONFIG_FILE}
    return out


@register
class DeepSpeed(Framework):
    """DeepSpeed (ZeRO 0-3, pipeline engine) through Megatron-DeepSpeed's launcher."""

    name = "deepspeed"
    file_names = (CONFIG_FILE, ARGS_FILE)

    def export(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> ExportResult:
        refuse_fp8(plan, "DeepSpeed")
        refuse_tp_overlap(plan, "DeepSpeed")
        refuse_deepep(plan, "DeepSpeed")
        u = _check(plan, model)
        return ExportResult(target=self.name, files={CONFIG_FILE: json.dumps(ds_config(u), indent=2) + "\n",
                                                     ARGS_FILE: args_text(launcher_args(u, model))},
                            assumptions=ASSUMES, cannot_carry=CANNOT_CARRY)

    def import_(self, files: Mapping[str, str], model: ModelSpec, cluster: ClusterSpec) -> Plan:
        if CONFIG_FILE not in files:
            raise SpecError("files", f"give {CONFIG_FILE} (and {ARGS_FILE} for tp/pp/Ulysses degrees)")
        config = parse_json_text(files[CONFIG_FILE])  # the shared reader: its limits and one-line errors
        args = parse_args_text(files.get(ARGS_FILE, ""))
        return plan_from_config(config, args, model, cluster)

    def seq_length(self, files: Mapping[str, str]) -> int | None:
        return _int(parse_args_text(files.get(ARGS_FILE, "")), "seq_length", None, "--")


def _int(raw: Mapping[str, Any], key: str, default: int | None, where: str, minimum: int = 1) -> int | None:
    value = raw.get(key, default)
    return None if value is None else count_of(value, f"{where}{key}", minimum)


def plan_from_config(config: Mapping[str, Any], args: Mapping[str, Any], model: ModelSpec,
                     cluster: ClusterSpec) -> Plan:
    if not isinstance(config, dict):
        raise SpecError(CONFIG_FILE, "expected a JSON object")
    tp, pp = _int(args, "tensor_model_parallel_size", 1, "--"), _int(args, "pipeline_model_parallel_size", 1, "--")
    uly = _int(args, "ds_sequence_parallel_size", 1, "--")
    if "seq_length" in args and _int(args, "seq_length", None, "--") != model.seq_len:
        raise SpecError("--seq-length", f"{args['seq_length']} but the model is built for seq {model.seq_len}")
    if cluster.world_size % (tp * pp * uly):
        raise SpecError("--tensor-model-parallel-size", f"tp {tp} * pp {pp} * ulysses {uly} does not divide "
                        f"{cluster.world_size} GPUs")
    dp = cluster.world_size // (tp * pp * uly)
    batch, _, steps = _batch(config, dp)
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise SpecError("zero_optimization", f"expected an object, got {zero!r}")
    stage = _int(zero, "stage", 0, "zero_optimization.", minimum=0)
    kinds = {v: k for k, v in STAGES.items()}
    if stage not in kinds:
        raise SpecError("zero_optimization.stage", f"must be 0..3, got {stage}")
    checkpoint = args.get("checkpoint_activations") is True or args.get("recompute_granularity") == "full"
    sp = args.get("sequence_parallel") is True
    u = Uniform(tp=tp, ulysses=uly, dp=dp, pp=pp, dp_type=kinds[stage], megatron_sp=sp,
                recompute=Recompute.FULL if checkpoint else Recompute.NONE, global_batch=batch,
                micro_batches=steps, vocab_tp=uly if uly > 1 else tp,
                vocab_sp=SequenceParallel.ULYSSES if uly > 1 else SequenceParallel.MEGATRON if sp else SequenceParallel.NONE,
                vocab_zero3=vocab_sharded(kinds[stage], dp * uly, model))
    return plan_from_uniform(u, model, cluster)


def _batch(config: Mapping[str, Any], dp: int) -> tuple[int, int, int]:
    """(train_batch_size, micro batch per GPU, accumulation steps), the missing one derived as
    DeepSpeed derives it; SpecError when they disagree."""
    batch = _int(config, "train_batch_size", None, "")
    micro = _int(config, "train_micro_batch_size_per_gpu", None, "")
    steps = _int(config, "gradient_accumulation_steps", None, "")
    if batch is None and micro is None:
        raise SpecError("train_batch_size", "give train_batch_size or train_micro_batch_size_per_gpu")
    if batch is None:
        steps = steps or 1
        batch = micro * steps * dp
    elif micro is None:
        steps = steps or 1
        micro = batch // (steps * dp)
    elif steps is None:
        steps = batch // (micro * dp)
    if batch != micro * steps * dp or min(batch, micro, steps) < 1:
        raise SpecError("train_batch_size", f"{batch} != micro batch {micro} * accumulation {steps} * dp {dp}")
    return batch, micro, steps
