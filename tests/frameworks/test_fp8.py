"""FP8 plans in framework files: Megatron writes the recipe and its BF16 end layers and reads them
back; the other targets refuse FP8 in one line."""
from __future__ import annotations

from dataclasses import replace

import pytest

import frameworks
from frameworks.megatron import ARGS_FILE, BRIDGE_FILE, parse_args_text
from specs import SpecError, load_cluster, load_model, uniform_plan


def _plan(precision, bf16_layers=(), cluster="dgx-h100", pp=1):
    model = load_model("llama3-8b")
    plan = uniform_plan(model.num_layers, tp=2, dp=4 // pp, pp=pp, global_batch=32, micro_batches=4, sp="megatron",
                        precision=precision, model=model.name)
    layers = tuple(replace(s, precision="bf16") if i in bf16_layers else s for i, s in enumerate(plan.layers))
    return replace(plan, vocab_tp=2, vocab_sp="megatron", layers=layers), model, load_cluster(cluster)


def _precisions(plan):
    return [str(s.precision) for s in plan.layers]


@pytest.mark.parametrize("precision, cluster, fmt, recipe", [("fp8-current", "dgx-h100", "hybrid", "tensorwise"),
                                                            ("fp8-delayed", "dgx-h100", "hybrid", "delayed"),
                                                            ("mxfp8", "dgx-b200", "e4m3", "mxfp8")])
def test_megatron_writes_each_recipe_and_reads_it_back(precision, cluster, fmt, recipe):
    plan, model, cluster = _plan(precision, cluster=cluster)
    files = frameworks.get("megatron").export(plan, model, cluster).files
    args = parse_args_text(files[ARGS_FILE])
    assert (args["fp8_format"], args["fp8_recipe"]) == (fmt, recipe) and "first_last_layers_bf16" not in args
    for given in (files, {BRIDGE_FILE: files[BRIDGE_FILE]}):
        assert _precisions(frameworks.get("megatron").import_(given, model, cluster)) == _precisions(plan)


def test_megatron_keeps_the_first_and_last_layers_in_bf16():
    plan, model, cluster = _plan("fp8-current", bf16_layers=(0, 1, 31))
    files = frameworks.get("megatron").export(plan, model, cluster).files
    args = parse_args_text(files[ARGS_FILE])
    assert args["first_last_layers_bf16"] is True
    assert (args["num_layers_at_start_in_bf16"], args["num_layers_at_end_in_bf16"]) == ("2", "1")
    assert "mixed_precision:\n  fp8: hybrid\n  fp8_recipe: tensorwise\n" in files[BRIDGE_FILE]
    back = frameworks.get("megatron").import_(files, model, cluster)
    assert _precisions(back) == ["bf16", "bf16"] + ["fp8-current"] * 29 + ["bf16"]


@pytest.mark.parametrize("precision, bf16_layers, pp, message", [
    ("fp8-current", (5,), 1, r"^layer 5: precision bf16 between FP8 layers: Megatron keeps only its first and last"),
    ("fp8-delayed", (31,), 1, r"^layer 31: precision bf16 beside fp8-delayed layers: Megatron-Core keeps no BF16"),
    ("fp8-current", tuple(range(9)), 4, r"^layers: 9 BF16 layers first and 0 last: Megatron-Core keeps at most 8 "),
])
def test_megatron_refuses_what_it_cannot_run_in_one_line(precision, bf16_layers, pp, message):
    plan, model, cluster = _plan(precision, bf16_layers=bf16_layers, pp=pp)
    with pytest.raises(SpecError, match=message):
        frameworks.get("megatron").export(plan, model, cluster)


def test_megatron_import_refuses_a_recipe_the_plan_has_no_precision_for():
    plan, model, cluster = _plan("fp8-current")
    text = frameworks.get("megatron").export(plan, model, cluster).files[ARGS_FILE]
    with pytest.raises(SpecError, match=r"^--fp8-recipe: blockwise: hybridpar's plan runs FP8 as "):
        frameworks.get("megatron").import_({ARGS_FILE: text.replace("tensorwise", "blockwise")}, model, cluster)


@pytest.mark.parametrize("target, name", [("torchtitan", "torchtitan"), ("deepspeed", "DeepSpeed"),
                                          ("galvatron", "Galvatron")])
def test_the_other_targets_refuse_fp8_naming_themselves(target, name):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    plan = uniform_plan(model.num_layers, dp=8, global_batch=32, micro_batches=4, precision="fp8-current",
                        model=model.name)
    with pytest.raises(SpecError, match=rf"^layer 0: precision fp8-current: FP8 is not written to {name} files$"):
        frameworks.get(target).export(plan, model, cluster)
