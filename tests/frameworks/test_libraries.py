"""Exported configs loaded by the frameworks' own config classes (pip install -e '.[export]'):
torchtitan's ConfigManager, Megatron-Core's TransformerConfig, DeepSpeed's DeepSpeedConfig; each
skipped where its library is not installed."""
from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

import frameworks
from frameworks.megatron import parse_args_text, parse_bridge_yaml
from specs import DPType, Recompute
from tests.frameworks.plans import expressible, llama, plan


def _export(target, p):
    model, cluster = llama()
    return frameworks.get(target).export(p, model, cluster).files


@pytest.mark.parametrize("index", [0, 1, 2, 3, -1])
def test_torchtitan_config_manager_reads_the_export(index):
    pytest.importorskip("triton")  # torchtitan's model registry imports it
    manager = pytest.importorskip("torchtitan.config.manager")
    p = expressible("torchtitan")[index]
    argv = shlex.split(_export("torchtitan", p)["torchtitan_args.txt"])
    config = manager.ConfigManager().parse_args(argv)
    par, training, s = config.parallelism, config.training, p.layers[0]
    shard = s.dp if s.dp_type in (DPType.ZERO2, DPType.ZERO3) else 1
    assert (par.data_parallel_shard_degree, par.data_parallel_replicate_degree) == (shard, s.dp // shard)
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (s.tp, p.pp)
    assert par.enable_sequence_parallel == s.megatron_sp
    assert config.compile.enable_async_tensor_parallel == p.tp_comm_overlap
    assert training.global_batch_size == p.global_batch and training.seq_len == 8192
    assert training.mixed_precision_param == "bfloat16"
    ac = type(config.activation_checkpoint).__qualname__ if config.activation_checkpoint is not None else "None"
    assert ac.startswith({Recompute.FULL: "FullAC", Recompute.NONE: "NoAC", Recompute.SELECTIVE_OP: "SelectiveAC"}
                         [s.recompute]) or (
        s.recompute == Recompute.NONE and ac == "None"), ac
    if p.pp > 1:
        expected = "Interleaved1F1B" if p.virtual_stages > 1 else {"1f1b": "1F1B", "gpipe": "GPipe"}[p.schedule]
        assert par.pipeline_parallel_schedule == expected
        assert training.local_batch_size // par.pipeline_parallel_microbatch_size == p.micro_batches
        assert par.pipeline_parallel_layers_per_stage * p.pp * p.virtual_stages == 80
    if shard > 1:
        assert par.fsdp_reshard_after_forward == {DPType.ZERO3: "always", DPType.ZERO2: "never"}[s.dp_type]
    parallel_dims = pytest.importorskip("torchtitan.distributed.parallel_dims")
    parallel_dims.ParallelDims.from_config(par, world_size=64)  # its degree checks: product == world


def test_megatron_core_transformer_config_accepts_an_fp8_export():
    """The FP8 recipe and BF16 end layers as Megatron-LM passes them on (--fp8-format is the fp8
    field), through TransformerConfig's own checks."""
    from dataclasses import replace
    from specs import load_cluster, load_model, uniform_plan
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    model = load_model("llama3-8b")
    plan = uniform_plan(32, tp=2, dp=4, global_batch=32, micro_batches=4, sp="megatron", precision="fp8-current",
                        model=model.name)
    plan = replace(plan, vocab_tp=2, vocab_sp="megatron",
                   layers=tuple(replace(s, precision="bf16") if i in (0, 31) else s for i, s in enumerate(plan.layers)))
    args = parse_args_text(frameworks.get("megatron").export(plan, model, load_cluster("dgx-h100")).files["megatron_args.txt"])
    fields = {f.name for f in dataclasses.fields(tc.TransformerConfig)}
    kw = {("fp8" if k == "fp8_format" else k): v for k, v in args.items()}
    kw = {k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in kw.items() if k in fields}
    kw.pop("normalization", None)
    config = tc.TransformerConfig(**kw, pipeline_dtype=__import__("torch").bfloat16)
    assert (config.fp8, config.fp8_recipe) == ("hybrid", "tensorwise")
    assert config.first_last_layers_bf16 and (config.num_layers_at_start_in_bf16, config.num_layers_at_end_in_bf16) == (1, 1)


@pytest.mark.parametrize("index", [0, 1, 2, 3, -1])
def test_megatron_core_transformer_config_accepts_the_export(index):
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    p = expressible("megatron")[index]
    files = _export("megatron", p)
    args = parse_args_text(files["megatron_args.txt"])
    fields = {f.name for f in dataclasses.fields(tc.TransformerConfig)}
    # as Megatron-LM's core_transformer_config_from_args does: every argument named like a field
    kw = {k: v for k, v in args.items() if k in fields}
    kw = {k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in kw.items()}
    kw.pop("normalization", None)
    renames = {"decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
               "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage"}
    kw.update({new: int(args[old]) for old, new in renames.items() if old in args})
    if "num_layers_per_virtual_pipeline_stage" in args:
        kw["virtual_pipeline_model_parallel_size"] = p.virtual_stages
    kw["num_query_groups"] = int(args["num_query_groups"])
    kw["pipeline_dtype"] = __import__("torch").bfloat16
    config = tc.TransformerConfig(**kw)  # its __post_init__ checks degrees, recompute, sp, pipeline layout
    s = p.layers[0]
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (s.tp, p.pp)
    assert config.sequence_parallel == s.megatron_sp and config.bf16
    assert config.tp_comm_overlap == p.tp_comm_overlap
    assert config.recompute_granularity == (None if s.recompute == Recompute.NONE else str(s.recompute))
    assert (config.virtual_pipeline_model_parallel_size or 1) == p.virtual_stages
    # the Bridge override's model section is TransformerConfig's own fields
    model_section = _yaml_section(files["megatron_bridge_override.yaml"], "model")
    assert model_section.pop("seq_length") == 8192  # Bridge's GPTModelProvider field, not TransformerConfig's
    bridge = tc.TransformerConfig(**model_section, num_layers=80, hidden_size=8192, num_attention_heads=64,
                                  pipeline_dtype=kw["pipeline_dtype"])
    assert (bridge.tensor_model_parallel_size, bridge.pipeline_model_parallel_size) == (s.tp, p.pp)
    assert (bridge.virtual_pipeline_model_parallel_size or 1) == p.virtual_stages
    assert bridge.recompute_granularity == config.recompute_granularity
    assert int(parse_bridge_yaml(files["megatron_bridge_override.yaml"])["micro_batch_size"]) == p.micro_batch_size(0)


def _yaml_section(text, name):
    out, current = {}, None
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            current = line.rstrip(":")
        elif current == name and line.strip():
            key, _, value = line.strip().partition(": ")
            out[key] = {"true": True, "false": False, "null": None}.get(value, int(value) if value.isdigit() else value)
    return out


@pytest.mark.parametrize("index", range(3))
def test_deepspeed_config_class_reads_the_export(index, monkeypatch):
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)  # no process group here: rank 0 of the mpu's dp
    p = expressible("deepspeed")[index]
    s = p.layers[0]

    class Mpu:  # the data-parallel size DeepSpeed takes from Megatron's mpu
        def get_data_parallel_world_size(self):
            return s.dp

        def get_data_parallel_rank(self):
            return 0

        def get_model_parallel_world_size(self):
            return s.tp

        def get_sequence_parallel_world_size(self):
            return s.ulysses

    raw = json.loads(_export("deepspeed", p)["ds_config.json"])
    config = ds_config.DeepSpeedConfig(raw, mpu=Mpu())
    assert config.train_batch_size == p.global_batch
    assert config.train_micro_batch_size_per_gpu == p.micro_batch_size(0)
    assert config.gradient_accumulation_steps == p.micro_batches
    assert config.zero_optimization_stage == {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}[s.dp_type]
    assert config.bfloat16_config.enabled and not config.float16_config.enabled


def test_megatron_core_accepts_chunks_of_only_the_embedding_and_the_loss():
    """Llama 3's layout on Llama 3 70B (pp 2 x 41 chunks of one layer, the embedding and the loss
    accounted): the Bridge override's model section passes TransformerConfig's checks with 41
    chunks a rank."""
    from dataclasses import replace
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    model, cluster = llama()
    p = plan(model, cluster, tp=8, dp=4, pp=2, global_batch=64, micro_batches=2, sp="megatron", dp_type="zero1")
    p = replace(p, schedule="interleaved_1f1b", virtual_stages=41, chunk_layers=(0,) + (1,) * 80 + (0,),
                stage_layers=(40, 40))
    files = frameworks.get("megatron").export(p, model, cluster).files
    section = _yaml_section(files["megatron_bridge_override.yaml"], "model")
    section.pop("seq_length")
    config = tc.TransformerConfig(**section, num_layers=80, hidden_size=8192, num_attention_heads=64,
                                  pipeline_dtype=__import__("torch").bfloat16)
    assert config.virtual_pipeline_model_parallel_size == 41
    assert config.account_for_embedding_in_pipeline_split and config.account_for_loss_in_pipeline_split
