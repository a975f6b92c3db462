"""Plan.ep_dispatcher in the framework files: Megatron writes DeepEP as Megatron-Core selects it (the flex
dispatcher with moe_enable_deepep) and the plain all-to-all as its alltoall dispatcher, and reads both back;
torchtitan, DeepSpeed and Galvatron files cannot select DeepEP and refuse it in one line."""
from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

import frameworks
from frameworks.megatron import parse_args_text, parse_bridge_yaml
from specs import SpecError, load_cluster, load_model, uniform_plan


def _moe(dispatcher: str = "deepep"):
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100:2")
    p = uniform_plan(model.num_layers, tp=2, dp=8, global_batch=32, micro_batches=2, sp="megatron", dp_type="zero1")
    p = replace(p, layers=tuple(replace(s, ep=4) for s in p.layers), vocab_tp=2, vocab_sp="megatron",
                model=model.name, cluster=cluster.name, ep_dispatcher=dispatcher)
    p.validate(model, cluster)
    return model, cluster, p


@pytest.mark.parametrize("dispatcher, flags", [
    ("deepep", {"moe_token_dispatcher_type": "flex", "moe_enable_deepep": True}),
    ("all_to_all", {"moe_token_dispatcher_type": "alltoall"}),
])
def test_megatron_writes_and_reads_back_the_dispatcher(dispatcher, flags):
    model, cluster, p = _moe(dispatcher)
    fw = frameworks.get("megatron")
    files = fw.export(p, model, cluster).files
    args, bridge = parse_args_text(files["megatron_args.txt"]), parse_bridge_yaml(files["megatron_bridge_override.yaml"])
    for key, value in flags.items():
        assert args[key] == value and bridge[key] == value
    assert "moe_enable_deepep" in args or dispatcher != "deepep"
    for name in files:  # each file alone carries the plan
        assert fw.import_({name: files[name]}, model, cluster) == p


def test_megatron_reads_the_newer_backend_flag_and_refuses_hybridep():
    model, cluster, p = _moe()
    fw = frameworks.get("megatron")
    args = fw.export(p, model, cluster).files["megatron_args.txt"]
    newer = args.replace("--moe-enable-deepep", "--moe-flex-dispatcher-backend deepep")
    assert fw.import_({"megatron_args.txt": newer}, model, cluster).ep_dispatcher == "deepep"
    with pytest.raises(SpecError) as err:
        fw.import_({"megatron_args.txt": newer.replace("backend deepep", "backend hybridep")}, model, cluster)
    assert str(err.value) == ("--moe-flex-dispatcher-backend: hybridep: hybridpar's plan dispatches by all-to-all or "
                              "DeepEP (ep_dispatcher)")


@pytest.mark.parametrize("target, words", [
    ("torchtitan", "ep_dispatcher: deepep: torchtitan selects DeepEP in the model's registration (its MoE config's "
                   "moe_comm_backend), not in the job config written here"),
    ("deepspeed", "ep_dispatcher: deepep: DeepSpeed files have no DeepEP dispatcher"),
    ("galvatron", "ep_dispatcher: deepep: Galvatron files have no DeepEP dispatcher"),
])
def test_targets_without_deepep_refuse_it_in_one_line(target, words):
    model, cluster, p = _moe()
    with pytest.raises(SpecError) as err:
        frameworks.get(target).export(p, model, cluster)
    assert str(err.value) == words


def test_megatron_core_takes_the_deepep_settings():
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    model, cluster, p = _moe()
    args = parse_args_text(frameworks.get("megatron").export(p, model, cluster).files["megatron_args.txt"])
    fields = {f.name for f in dataclasses.fields(tc.TransformerConfig)}
    kw = {k: v for k, v in args.items() if k.startswith("moe_") and k in fields}
    assert kw == {"moe_token_dispatcher_type": "flex", "moe_enable_deepep": True}
    with pytest.warns(UserWarning):  # 0.16 names it moe_flex_dispatcher_backend and says so
        config = tc.TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
                                      expert_model_parallel_size=4, **kw)
    assert config.moe_token_dispatcher_type == "flex" and getattr(config, "moe_flex_dispatcher_backend",
                                                                 "deepep") == "deepep"
