"""Precision as a plan choice: per-layer field, one FP8 recipe per plan, GPUs that run it, refusals."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
from executor.unsupported import refuse_unsupported
from specs import LayerStrategy, Plan, SpecError, load_cluster, load_model, plan_to_galvatron, uniform_plan
from specs.precision import Precision, fp8_recipe, runnable_on


@pytest.fixture(scope="module")
def gpt():
    return load_model("tiny-gpt")


def test_default_is_bf16_and_files_without_the_field_load_as_bf16(gpt):
    plan = uniform_plan(gpt.num_layers, dp=2, global_batch=8)
    assert plan.precision == Precision.BF16 and plan.layers[0].precision == "bf16"
    raw = plan.to_dict()
    for layer in raw["layers"]:
        del layer["precision"]
    assert Plan.from_dict(raw) == plan
    fp8 = plan.with_precision("fp8-delayed")
    assert Plan.from_dict(fp8.to_dict()) == fp8


def test_first_and_last_layers_kept_in_bf16(gpt):
    plan = uniform_plan(gpt.num_layers, dp=2, global_batch=8).with_precision("fp8-current", bf16_ends=1)
    kinds = [s.precision for s in plan.layers]
    assert kinds[0] == kinds[-1] == "bf16" and set(kinds[1:-1]) == {"fp8-current"}
    assert plan.precision == "fp8-current" and "fp8-current" in plan.summary()


def test_bad_values_and_two_recipes_are_one_line(gpt):
    with pytest.raises(SpecError, match=r"^precision: 'fp4' is not a precision; choose from bf16, fp8-delayed"):
        LayerStrategy(precision="fp4")
    with pytest.raises(SpecError, match=r"layers\[0\]\.precision"):
        Plan.from_dict({**uniform_plan(gpt.num_layers, global_batch=8).to_dict(),
                        "layers": [{"precision": "fp4"}] * gpt.num_layers})
    assert fp8_recipe(["bf16", "mxfp8", "bf16"]) == Precision.MXFP8
    with pytest.raises(SpecError, match="one FP8 recipe beside bf16, got fp8-delayed, fp8-current"):
        fp8_recipe(["fp8-current", "fp8-delayed"])


def test_the_gpu_fields_say_who_runs_fp8_and_mxfp8(gpt):
    plan = uniform_plan(gpt.num_layers, dp=8, global_batch=8)
    h100, b200, a100 = (load_cluster(n) for n in ("dgx-h100", "dgx-b200", "dgx-a100-80g"))
    assert runnable_on(tuple(Precision), a100.gpu) == (Precision.BF16,)  # no gpu.peak_fp8_tflops
    assert runnable_on(tuple(Precision), h100.gpu) == (Precision.BF16, Precision.FP8_DELAYED, Precision.FP8_CURRENT)
    assert runnable_on(tuple(Precision), b200.gpu) == tuple(Precision)  # gpu.mxfp8
    plan.with_precision("mxfp8").validate(gpt, b200)
    with pytest.raises(SpecError, match=r"^layer 0: mxfp8 needs tensor cores with MX block scaling \(gpu.mxfp8\)"):
        plan.with_precision("mxfp8").validate(gpt, h100)
    with pytest.raises(SpecError, match=r"^layer 0: fp8-current needs an FP8 peak, and gpu.peak_fp8_tflops of A100"):
        plan.with_precision("fp8-current").validate(gpt, a100)
    with pytest.raises(SpecError, match=r"gpu.mxfp8: true needs gpu.peak_fp8_tflops"):
        replace(a100.gpu, mxfp8=True)


def test_consumers_without_fp8_refuse_it_in_one_line(gpt):
    plan = uniform_plan(gpt.num_layers, dp=8, global_batch=8).with_precision("fp8-current", bf16_ends=1)
    with pytest.raises(SpecError, match=r"^executor cannot run layer 1: precision fp8-current \(supported: bf16\)$"):
        refuse_unsupported(plan, gpt)
    with pytest.raises(SpecError, match=r"^layer 1: precision fp8-current has no field in Galvatron files"):
        plan_to_galvatron(plan)
    galvatron = cost_models.get("galvatron", load_cluster("dgx-h100"))
    with pytest.raises(SpecError, match=r"^galvatron cost model cannot run layer 0: precision fp8-current"):
        model = galvatron.model_spec
        galvatron.plan_cost(model, uniform_plan(model.num_layers, dp=8, global_batch=8, dp_type="zero3",
                                                precision="fp8-current"))
