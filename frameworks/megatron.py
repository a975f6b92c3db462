"""Megatron-LM command-line arguments and a Megatron-Bridge recipe override (YAML) for a plan,
and the way back: a Megatron-LM argument list or a Bridge override to a Plan."""
from __future__ import annotations

import shlex
from typing import Any, Mapping

from frameworks.base import (ExportResult, Framework, Uniform, chunk_pattern, count_of, plan_from_uniform,
                             register, schedule_of,
                             uniform_view)
from specs import (ClusterSpec, CPComm, CPLoadBalance, DPType, EPDispatcher, ModelSpec, Plan, Recompute, Schedule,
                   SequenceParallel, SpecError, chunk_layout)
from specs.precision import Precision
from specs.stack import SoftwareStack

ARGS_FILE = "megatron_args.txt"
BRIDGE_FILE = "megatron_bridge_override.yaml"

ASSUMES = (
    "tokenizer: --tokenizer-type NullTokenizer with the model's --vocab-size; put your tokenizer "
    "in its place (the vocabulary is padded to a multiple of 128 * tp, as hybridpar's cost model pads it)",
    "data: --mock-data; give --data-path for a real corpus",
    "optimizer: Adam in bf16 mixed precision (fp32 master weights and states), as the cost model charges",
    "model: the architecture flags written from the model config (RoPE for decoder-only models)",
    "layout: Megatron's default rank order tp-cp-ep-dp-pp (tp on neighbouring GPUs)",
    "FP8 (a plan with FP8 layers): the recipe and the BF16 end layers only; parameters gathered in BF16 "
    "(no --fp8-param-gather, as the cost model charges ZeRO-1's gather), amax history and margin at "
    "Megatron's defaults",
)
CANNOT_CARRY = (
    "the cost model's overlap and kernel-efficiency assumptions (Megatron's --overlap-grad-reduce, "
    "--overlap-param-gather and fused kernels change the measured time, not the plan)",
    "a vocabulary split other than the layers' (Megatron shards the embedding and head like the layers)",
)


def _check(plan: Plan, model: ModelSpec) -> Uniform:
    """The plan as Megatron runs it; one SpecError line for the first thing it cannot run."""
    u = uniform_view(plan, model, "Megatron", per_layer=("recompute",), carries_cp=True)
    if u.cp > 1 and plan.cp_load_balance != CPLoadBalance.ZIGZAG:
        raise SpecError("cp_load_balance", f"{plan.cp_load_balance}: Megatron splits a causal sequence in 2 cp "
                        "chunks (zigzag) always")
    for i, s in enumerate(plan.layers):
        if s.ulysses > 1:
            raise SpecError(f"layer {i}", "sp ulysses: Megatron has no Ulysses sequence parallelism "
                            "(its context parallelism is ring attention)")
        if s.dp_type in (DPType.ZERO2, DPType.ZERO3) and s.degrees.grad_sync > 1:
            raise SpecError(f"layer {i}", f"dp_type {s.dp_type}: Megatron runs DDP or the distributed "
                            "optimizer (zero1)")
        if s.tp > 1 and s.dp > 1 and not s.tp_consecutive:
            raise SpecError(f"layer {i}", "tp_consecutive false: Megatron puts tp on neighbouring ranks")
        if s.has_expert_split and s.expert_dp_kind != s.dp_type and s.expert_dp > 1:
            raise SpecError(f"layer {i}", f"expert_dp_type {s.expert_dp_kind} differs from dp_type "
                            f"{s.dp_type}: one --use-distributed-optimizer covers both")
    if schedule_of(plan)[0] != Schedule.ONE_F_ONE_B:
        raise SpecError("schedule", f"{plan.schedule}: Megatron runs 1F1B (interleaved with virtual stages)")
    if plan.vocab_tp != u.tp or plan.vocab_zero3 or plan.vocab_sp != plan.layers[0].sp:
        raise SpecError("vocab_tp", f"vocab tp {plan.vocab_tp} sp {plan.vocab_sp} zero3 {plan.vocab_zero3}: "
                        f"Megatron shards the embedding and head like the layers (tp {u.tp}, sp {plan.layers[0].sp})")
    _first_last(plan)
    _recompute_args(plan)
    return u


def _first_last(plan: Plan) -> tuple[int | None, int | None]:
    """(--decoder-first-pipeline-num-layers, --decoder-last-...) for the partition, or refuse it."""
    stages = list(plan.stage_layers)
    if len(set(stages)) == 1 or plan.virtual_stages > 1 and chunk_pattern(plan, "Megatron"):
        return None, None  # interleaved: the chunk layout says it
    middle = stages[1:-1]
    if plan.virtual_stages > 1 or len(set(middle)) > 1 or plan.pp < 3:
        raise SpecError("stage_layers", f"{stages}: Megatron sets only the first and the last stage apart "
                        "from an even split of the others (and none when interleaved)")
    first = stages[0] if stages[0] != middle[0] else None
    last = stages[-1] if stages[-1] != middle[0] else None
    return first, last


def _recompute_args(plan: Plan) -> dict[str, Any]:
    """Megatron's recompute arguments for the per-layer recompute of ``plan``: one kind for every
    layer, or full on the first N layers of every stage and none after (--recompute-method block)."""
    kinds = {s.recompute for s in plan.layers}
    if Recompute.SELECTIVE_OP in kinds:
        layer = next(i for i, s in enumerate(plan.layers) if s.recompute == Recompute.SELECTIVE_OP)
        raise SpecError(f"layer {layer}", "recompute selective-op: torchtitan's per-op policy; Megatron recomputes "
                        "the attention core (selective) or whole layers (full)")
    if kinds == {Recompute.NONE}:
        return {}
    if kinds == {Recompute.SELECTIVE}:
        return {"recompute_granularity": "selective"}
    if kinds == {Recompute.FULL}:
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    blocks = set()
    for stage, layers in enumerate(plan.stage_ranges()):
        flags = [plan.layers[i].recompute for i in layers]
        n = sum(1 for f in flags if f == Recompute.FULL)
        if Recompute.SELECTIVE in flags or flags != [Recompute.FULL] * n + [Recompute.NONE] * (len(flags) - n):
            raise SpecError(f"layer {layers[0]}", f"recompute {[str(f) for f in flags]} on stage {stage}: Megatron "
                            "recomputes one kind for every layer, or full on the first N layers of every stage")
        blocks.add(n)
    if len(blocks) > 1 or plan.virtual_stages > 1:
        raise SpecError("recompute", f"full recompute on {sorted(blocks)} leading layers of the stages: "
                        "--recompute-num-layers is one number for every stage (and chunk)")
    return {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": blocks.pop()}


def parallel_settings(plan: Plan, model: ModelSpec) -> dict[str, Any]:
    """The plan's settings under Megatron-Core's TransformerConfig/ModelParallelConfig names
    (plus the training loop's micro/global batch and the distributed optimizer)."""
    u = _check(plan, model)
    first, last = _first_last(plan)
    out: dict[str, Any] = {
        "tensor_model_parallel_size": u.tp, "pipeline_model_parallel_size": u.pp,
        "sequence_parallel": u.megatron_sp, "context_parallel_size": u.cp,
        "micro_batch_size": u.micro_batch_size, "global_batch_size": u.global_batch,
        "seq_length": model.seq_len, "use_distributed_optimizer": u.dp_type == DPType.ZERO1 and u.dp * u.cp > 1,
    }
    if u.cp > 1:
        out["cp_comm_type"] = u.cp_comm
    if u.virtual_stages > 1:
        per_chunk, ends = chunk_pattern(plan, "Megatron")
        out["num_layers_per_virtual_pipeline_stage"] = per_chunk
        if ends:
            out.update(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    if first is not None:
        out["decoder_first_pipeline_num_layers"] = first
    if last is not None:
        out["decoder_last_pipeline_num_layers"] = last
    if any(spec.moe is not None for spec in model.layers):
        out["expert_model_parallel_size"] = u.ep
        out["expert_tensor_parallel_size"] = u.expert_tp or u.tp
        if u.ep > 1:
            out.update(DISPATCHERS[u.ep_dispatcher])
    out.update(_recompute_args(plan))
    out.update(_fp8_args(plan))
    if u.tp_comm_overlap:  # Transformer Engine's userbuffers
        out["tp_comm_overlap"] = True
    return out


FP8_RECIPES = {Precision.FP8_DELAYED: ("hybrid", "delayed"), Precision.FP8_CURRENT: ("hybrid", "tensorwise"),
               Precision.MXFP8: ("e4m3", "mxfp8")}
"""Each FP8 precision as Megatron-Core's (fp8 format, fp8_recipe), as Megatron-Bridge's presets set
them (bf16_with_fp8_delayed_scaling_mixed, bf16_with_fp8_current_scaling_mixed, bf16_with_mxfp8_mixed):
E4M3 forward and E5M2 gradients (hybrid) for per-tensor scaling, E4M3 throughout for MXFP8."""
FP8_LAYER_FIELDS = ("first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")


def _fp8_args(plan: Plan) -> dict[str, Any]:
    """The FP8 recipe of the plan's FP8 layers (Plan.validate allows one), and the BF16 layers
    before and after them (Megatron keeps BF16 only at the ends: --first-last-layers-bf16)."""
    fp8 = [i for i, s in enumerate(plan.layers) if s.precision.is_fp8]
    if not fp8:
        return {}
    for i in range(fp8[0], fp8[-1]):
        if not plan.layers[i].precision.is_fp8:
            raise SpecError(f"layer {i}", "precision bf16 between FP8 layers: Megatron keeps only its first "
                            "and last layers in BF16 (--first-last-layers-bf16)")
    precision = plan.layers[fp8[0]].precision
    fmt, recipe = FP8_RECIPES[precision]
    out: dict[str, Any] = {"fp8": fmt, "fp8_recipe": recipe}
    start, end = fp8[0], len(plan.layers) - 1 - fp8[-1]
    if not start and not end:
        return out
    if precision == Precision.FP8_DELAYED:  # TransformerConfig's own check
        raise SpecError(f"layer {fp8[0] - 1 if start else fp8[-1] + 1}", "precision bf16 beside fp8-delayed layers: "
                        "Megatron-Core keeps no BF16 end layers under delayed scaling")
    per_stage = len(plan.layers) // plan.pp
    if max(start, end) > per_stage:
        raise SpecError("layers", f"{start} BF16 layers first and {end} last: Megatron-Core keeps at most "
                        f"{per_stage} (the layers of one of its {plan.pp} stages) at each end")
    return out | dict(zip(FP8_LAYER_FIELDS, (True, start, end)))


def _precisions(s: Mapping[str, Any], num_layers: int) -> tuple[Precision, ...]:
    """Each layer's precision under Megatron settings (fp8 format and recipe, BF16 end layers);
    empty where they set no FP8."""
    fmt = s.get("fp8")
    if fmt in (None, False, "None", "none"):
        return ()
    recipes = {recipe: p for p, (_, recipe) in FP8_RECIPES.items()}
    recipe = s.get("fp8_recipe", "delayed")  # Megatron-Core's default recipe
    if recipe not in recipes:
        raise SpecError("--fp8-recipe", f"{recipe}: hybridpar's plan runs FP8 as "
                        f"{', '.join(recipes)} ({', '.join(recipes.values())})")
    if fmt not in ("hybrid", "e4m3"):
        raise SpecError("--fp8-format", f"{fmt}: Megatron's FP8 formats are hybrid and e4m3")
    start = end = 0
    if s.get("first_last_layers_bf16", False) in (True, "true", "True"):
        start = _int(s, "num_layers_at_start_in_bf16", 1, minimum=0)
        end = _int(s, "num_layers_at_end_in_bf16", 1, minimum=0)
    if start + end >= num_layers:
        raise SpecError("--num-layers-at-start-in-bf16", f"{start} + {end} BF16 end layers leave none of "
                        f"{num_layers} in FP8")
    return (Precision.BF16,) * start + (recipes[recipe],) * (num_layers - start - end) + (Precision.BF16,) * end


def _model_args(model: ModelSpec) -> dict[str, Any]:
    layer = model.layers[0]
    out: dict[str, Any] = {"num_layers": model.num_layers, "hidden_size": layer.hidden_size,
                           "ffn_hidden_size": layer.ffn_hidden_size, "num_attention_heads": layer.num_heads,
                           "max_position_embeddings": max(model.seq_len, model.embedding.max_positions)}
    if layer.kv_heads != layer.num_heads:
        out.update(group_query_attention=True, num_query_groups=layer.kv_heads)
    if layer.gated_ffn:
        out["swiglu"] = True
    if layer.norm == "rmsnorm":
        out["normalization"] = "RMSNorm"
    if not layer.bias:
        out["disable_bias_linear"] = True
    if model.embedding.max_positions == 0:
        out["position_embedding_type"] = "rope"
    if not model.head.tied:
        out["untie_embeddings_and_output_weights"] = True
    return out


def _flag(name: str) -> str:
    """``tensor_model_parallel_size`` -> ``--tensor-model-parallel-size`` (DeepSpeed's own
    ``--deepspeed_config`` keeps its underscore)."""
    return "--" + (name if name == "deepspeed_config" else name.replace("_", "-"))


def args_text(settings: Mapping[str, Any]) -> str:
    """One argument a line (True: a bare flag; False: left out)."""
    lines = []
    for k, v in settings.items():
        if v is False:
            continue
        lines.append(_flag(k) if v is True else f"{_flag(k)} {v}")
    return " \\\n".join(lines) + "\n"


DISPATCHERS = {EPDispatcher.ALL_TO_ALL: {"moe_token_dispatcher_type": "alltoall"},
               EPDispatcher.DEEPEP: {"moe_token_dispatcher_type": "flex", "moe_enable_deepep": True}}
"""Megatron-Core's settings for each Plan.ep_dispatcher (TransformerConfig: DeepEP needs the flex
dispatcher; Megatron-Core 0.16 reads moe_enable_deepep as moe_flex_dispatcher_backend deepep, its
default backend). Written for ep > 1 only: Megatron's own default dispatcher is allgather."""


def _ep_dispatcher(s: Mapping[str, Any]) -> EPDispatcher:
    """The dispatcher of Megatron settings: flex with the DeepEP backend (moe_enable_deepep, or
    moe_flex_dispatcher_backend deepep, its default) is deepep; any other type the all-to-all."""
    if s.get("moe_token_dispatcher_type") != "flex":
        return EPDispatcher.ALL_TO_ALL
    backend = s.get("moe_flex_dispatcher_backend") or "deepep"
    if backend != "deepep":
        raise SpecError("--moe-flex-dispatcher-backend", f"{backend}: hybridpar's plan dispatches by all-to-all "
                        "or DeepEP (ep_dispatcher)")
    return EPDispatcher.DEEPEP


BRIDGE_SECTIONS = {"micro_batch_size": "train", "global_batch_size": "train",
                   "use_distributed_optimizer": ("optimizer", "ddp"), "tp_comm_overlap": "comm_overlap",
                   **{k: "mixed_precision" for k in ("fp8", "fp8_recipe", *FP8_LAYER_FIELDS)}}
"""Where Megatron-Bridge's ConfigContainer keeps the settings that are not TransformerConfig's
(the FP8 recipe: its MixedPrecisionConfig, which sets the model's fields)."""
ARG_NAMES = {"fp8": "fp8_format"}
"""Megatron-LM's argument names that differ from the TransformerConfig field they set."""
FIELD_NAMES = {arg: field for field, arg in ARG_NAMES.items()}
BRIDGE_RENAMES = {"decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
                  "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage"}


def bridge_yaml(settings: Mapping[str, Any], model: ModelSpec) -> str:
    """A Megatron-Bridge recipe override: the model/train/optimizer/ddp sections of its ConfigContainer
    (and comm_overlap, its CommOverlapConfig, for TP communication overlap)."""
    sections: dict[str, dict[str, Any]] = {"model": {}, "train": {}, "optimizer": {}, "ddp": {}}
    for k, v in settings.items():
        where = BRIDGE_SECTIONS.get(k, "model")
        for section in (where if isinstance(where, tuple) else (where,)):
            sections.setdefault(section, {})[BRIDGE_RENAMES.get(k, k)] = v
    v = settings.get("num_layers_per_virtual_pipeline_stage")
    if v is not None:  # Bridge names the chunks per rank; the embedding and the loss count as layers when accounted
        del sections["model"]["num_layers_per_virtual_pipeline_stage"]
        accounted = 2 if settings.get("account_for_embedding_in_pipeline_split") else 0
        sections["model"]["virtual_pipeline_model_parallel_size"] = (model.num_layers + accounted) // (
            settings["pipeline_model_parallel_size"] * v)
    sections["model"]["bf16"] = True
    lines = ["# Megatron-Bridge recipe override (ConfigContainer sections), written by hybridpar"]
    for name, items in sections.items():
        lines.append(f"{name}:")
        lines += [f"  {k}: {_yaml_scalar(v)}" for k, v in items.items()]
    return "\n".join(lines) + "\n"


def _yaml_scalar(v: Any) -> str:
    return "true" if v is True else "false" if v is False else "null" if v is None else str(v)


@register
class Megatron(Framework):
    """Megatron-LM (arguments) and Megatron-Bridge (recipe override) over Megatron-Core."""

    name = "megatron"
    file_names = (ARGS_FILE, BRIDGE_FILE)
    command_line_file = ARGS_FILE

    def export(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> ExportResult:
        settings = parallel_settings(plan, model)
        args = {**_model_args(model), **{ARG_NAMES.get(k, k): v for k, v in settings.items()}, "bf16": True,
                "make_vocab_size_divisible_by": 128, "tokenizer_type": "NullTokenizer",
                "vocab_size": model.embedding.vocab_size, "mock_data": True}
        return ExportResult(target=self.name, files={ARGS_FILE: args_text(args), BRIDGE_FILE: bridge_yaml(settings, model)},
                            assumptions=ASSUMES, cannot_carry=CANNOT_CARRY)

    def import_(self, files: Mapping[str, str], model: ModelSpec, cluster: ClusterSpec) -> Plan:
        if ARGS_FILE in files:
            settings = {FIELD_NAMES.get(k, k): v for k, v in parse_args_text(files[ARGS_FILE]).items()}
        elif BRIDGE_FILE in files:
            settings = parse_bridge_yaml(files[BRIDGE_FILE])
        else:
            raise SpecError("files", f"give {ARGS_FILE} (Megatron-LM arguments) or {BRIDGE_FILE}")
        return plan_from_settings(settings, model, cluster)

    def seq_length(self, files: Mapping[str, str]) -> int | None:
        settings = parse_args_text(files[ARGS_FILE]) if ARGS_FILE in files else parse_bridge_yaml(files[BRIDGE_FILE])
        return _int(settings, "seq_length") if "seq_length" in settings else None


def parse_args_text(text: str) -> dict[str, Any]:
    """``--a-b 3 --flag`` (any layout, # comments, shell line continuations) -> {"a_b": "3", "flag": True}."""
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as err:  # an unclosed quote, a trailing escape
        raise SpecError("arguments", f"cannot split into words: {err}") from None
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise SpecError("arguments", f"expected a --flag, got {tok!r}")
        key, eq, value = tok[2:].partition("=")
        key = key.replace("-", "_")
        if eq:
            out[key] = value
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[key] = tokens[i + 1]
            i += 1
        else:
            out[key] = True
        i += 1
    return out


def parse_bridge_yaml(text: str) -> dict[str, Any]:
    """The override bridge_yaml writes (sections of ``key: scalar``) flattened back to settings."""
    out: dict[str, Any] = {}
    renames = {v: k for k, v in BRIDGE_RENAMES.items()}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line or not line.startswith(" "):
            continue
        key, colon, value = line.strip().partition(":")
        if not colon:
            raise SpecError(f"line {n}", f"expected 'key: value', got {raw.strip()!r}")
        value = value.strip()
        out[renames.get(key, key)] = {"true": True, "false": False, "null": None}.get(value, value)
    vpp = out.pop("virtual_pipeline_model_parallel_size", None)
    if vpp not in (None, "1"):
        out["num_virtual_stages_per_pipeline_rank"] = vpp
    return out


def _int(settings: Mapping[str, Any], key: str, default: int | None = None, minimum: int = 1) -> int:
    return count_of(settings.get(key, default), _flag(key), minimum)


def plan_from_settings(s: Mapping[str, Any], model: ModelSpec, cluster: ClusterSpec) -> Plan:
    """A Plan from Megatron settings (argument names with underscores)."""
    tp, pp = _int(s, "tensor_model_parallel_size", 1), _int(s, "pipeline_model_parallel_size", 1)
    cp, cp_comm = _int(s, "context_parallel_size", 1), s.get("cp_comm_type") or CPComm.P2P
    if cp > 1 and cp_comm not in (CPComm.P2P, CPComm.ALL_GATHER):
        raise SpecError("--cp-comm-type", f"{cp_comm}: an all-to-all inside Megatron's cp group has no field in "
                        "hybridpar's plan (its a2a+p2p is Ulysses beside the cp ring)")
    if "num_layers" in s and _int(s, "num_layers") != model.num_layers:
        raise SpecError("--num-layers", f"{s['num_layers']} but the model config has {model.num_layers} layers")
    if "seq_length" in s and _int(s, "seq_length") != model.seq_len:
        raise SpecError("--seq-length", f"{s['seq_length']} but the model is built for seq {model.seq_len}")
    world = cluster.world_size
    if world % (tp * pp * cp):
        raise SpecError("--tensor-model-parallel-size", f"tp {tp} * pp {pp} * cp {cp} does not divide {world} GPUs")
    dp = world // (tp * pp * cp)
    mbs, gbs = _int(s, "micro_batch_size", 1), _int(s, "global_batch_size", dp * _int(s, "micro_batch_size", 1))
    if gbs % (mbs * dp):
        raise SpecError("--global-batch-size", f"{gbs} is not a multiple of micro batch {mbs} * dp {dp}")
    v = _virtual_stages(s, model, pp)
    stages, chunks = chunk_layout(model.num_layers, pp, v) if v > 1 and _accounted(s) else (_stage_layers(s, model, pp), ())
    recompute, per_layer = _recompute(s, stages)
    ep, etp = _int(s, "expert_model_parallel_size", 1), _int(s, "expert_tensor_parallel_size", tp)
    sp = s.get("sequence_parallel", False) in (True, "true", "True")
    zero1 = s.get("use_distributed_optimizer", False) in (True, "true", "True")
    overlap = s.get("tp_comm_overlap", False) in (True, "true", "True")
    u = Uniform(tp=tp, cp=cp, cp_comm=cp_comm, dp=dp, pp=pp, dp_type=DPType.ZERO1 if zero1 else DPType.DDP,
                recompute=recompute,
                megatron_sp=sp, ep=ep, expert_tp=0 if etp == tp else etp, stage_layers=stages,
                global_batch=gbs, micro_batches=gbs // (mbs * dp), schedule="1f1b", virtual_stages=v, chunk_layers=chunks,
                vocab_tp=tp, vocab_sp=SequenceParallel.MEGATRON if sp else SequenceParallel.NONE,
                recompute_layers=per_layer, precision_layers=_precisions(s, model.num_layers),
                tp_comm_overlap=overlap, ep_dispatcher=_ep_dispatcher(s),
                stack=SoftwareStack.MEGATRON_TE if overlap else None)  # the overlap is Transformer Engine's
    return plan_from_uniform(u, model, cluster)


def _accounted(s: Mapping[str, Any]) -> bool:
    """--account-for-embedding/loss-in-pipeline-split: the embedding and the loss count as a layer each."""
    return s.get("account_for_embedding_in_pipeline_split", False) in (True, "true", "True")


def _virtual_stages(s: Mapping[str, Any], model: ModelSpec, pp: int) -> int:
    if s.get("num_layers_per_virtual_pipeline_stage") not in (None, False):
        per_chunk = _int(s, "num_layers_per_virtual_pipeline_stage")
        layers = model.num_layers + (2 if _accounted(s) else 0)
        if layers % (pp * per_chunk):
            counted = " (the embedding and the loss counted)" if _accounted(s) else ""
            raise SpecError("--num-layers-per-virtual-pipeline-stage", f"{per_chunk} does not divide "
                            f"{layers} layers{counted} over pp {pp}")
        return layers // (pp * per_chunk)
    if s.get("num_virtual_stages_per_pipeline_rank") not in (None, False):
        return _int(s, "num_virtual_stages_per_pipeline_rank")
    return 1


def _stage_layers(s: Mapping[str, Any], model: ModelSpec, pp: int) -> tuple[int, ...]:
    first = _int(s, "decoder_first_pipeline_num_layers", minimum=0) if s.get("decoder_first_pipeline_num_layers") else None
    last = _int(s, "decoder_last_pipeline_num_layers", minimum=0) if s.get("decoder_last_pipeline_num_layers") else None
    rest, middle = model.num_layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    if middle <= 0 or rest % middle:
        raise SpecError("--decoder-first-pipeline-num-layers", f"first {first} / last {last}: the other "
                        f"{rest} layers do not split evenly over {middle} stages")
    each = rest // middle
    stages = [each] * pp
    if first is not None:
        stages[0] = first
    if last is not None:
        stages[-1] = last
    return tuple(stages)


def _recompute(s: Mapping[str, Any], stages: tuple[int, ...]) -> tuple[Recompute, tuple[Recompute, ...]]:
    """(uniform recompute, per-layer recompute for the block method or ())."""
    granularity = s.get("recompute_granularity")
    if s.get("recompute_activations") is True:  # the older spelling of selective
        granularity = "selective"
    elif s.get("checkpoint_activations") is True:  # the older spelling of full, uniform
        granularity = granularity or "full"
    if granularity in (None, "none"):
        return Recompute.NONE, ()
    if granularity == "selective":
        return Recompute.SELECTIVE, ()
    if granularity != "full":
        raise SpecError("--recompute-granularity", f"must be full or selective, got {granularity!r}")
    method, n = s.get("recompute_method", "uniform"), _int(s, "recompute_num_layers", 1)
    if method == "uniform":
        if n != 1:
            raise SpecError("--recompute-num-layers", f"{n} with method uniform checkpoints groups of {n} "
                            "layers; hybridpar's plan recomputes per layer (1)")
        return Recompute.FULL, ()
    if method != "block":
        raise SpecError("--recompute-method", f"must be uniform or block, got {method!r}")
    per_layer = []
    for count in stages:
        per_layer += [Recompute.FULL] * min(n, count) + [Recompute.NONE] * max(count - n, 0)
    return Recompute.FULL, tuple(per_layer)
