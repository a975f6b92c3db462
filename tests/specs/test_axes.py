"""Degrees: one invariant naming its factors; plan files of version 1 (Ulysses degree in tp)
upgrade to version 2 (its own axis)."""
import json
from dataclasses import replace

import pytest

from specs import (PLAN_VERSION, Degrees, LayerStrategy, Plan, SpecError, load_cluster, load_model,
                   plan_from_galvatron, plan_to_galvatron, uniform_plan)

GPT = load_model("gpt-1.7b")  # 32 layers, 24 heads, seq 2048


def test_degrees_name_their_groups():
    d = LayerStrategy(ulysses=4, dp=2, sp="ulysses", dp_type="zero3").degrees
    assert (d.tp, d.ulysses, d.dp, d.cp) == (1, 4, 2, 1)
    assert (d.gpus, d.split, d.grad_sync, d.seq_split) == (8, 4, 8, 4)
    d = LayerStrategy(tp=4, dp=2, sp="megatron").degrees
    assert (d.gpus, d.split, d.grad_sync, d.seq_split) == (8, 4, 2, 4)
    assert Degrees(tp=2, dp=4, ep=4, etp=2).edp == 1


def test_the_invariant_names_the_factors_and_the_stage():
    with pytest.raises(SpecError, match=r"^layer 3: dp\(2\) \* tp\(4\) \* ulysses\(2\) = 16 != 8 GPUs of stage 0$"):
        Degrees(dp=2, tp=4, ulysses=2).check(8, "layer 3", 0)
    plan = uniform_plan(GPT.num_layers, tp=4, dp=2, pp=2, global_batch=32, micro_batches=2)
    plan = replace(plan, layers=plan.layers[:-1] + (LayerStrategy(tp=4, dp=4),))
    with pytest.raises(SpecError, match=r"layer 23: dp\(4\) \* tp\(4\) = 16 != 8 GPUs of stage 1"):
        plan.validate(GPT, load_cluster("dgx-a100-80g:2"))


def test_ulysses_with_tp_is_refused():
    plan = uniform_plan(GPT.num_layers, tp=2, ulysses=4, sp="ulysses", global_batch=8)
    with pytest.raises(SpecError, match=r"layer 0: ulysses\(4\) with tp\(2\) > 1 is not modelled"):
        plan.validate(GPT, load_cluster("dgx-a100-80g"))


def test_a_version_1_ulysses_plan_upgrades_to_its_own_axis():
    v1 = {"pp": 1, "stage_layers": [2], "global_batch": 8, "micro_batches": 1,
          "layers": [{"tp": 4, "dp": 2, "sp": "ulysses", "dp_type": "zero3"}, {"tp": 4, "dp": 2, "sp": "megatron"}]}
    plan = Plan.from_dict(v1)
    uly, meg = plan.layers
    assert (uly.tp, uly.ulysses, uly.dp, uly.sp, uly.dp_type) == (1, 4, 2, "ulysses", "zero3")
    assert (meg.tp, meg.ulysses, meg.sp) == (4, 1, "megatron")
    assert Plan.from_dict({**v1, "version": 1}) == plan
    saved = json.loads(plan.to_json())
    assert saved["version"] == PLAN_VERSION == 2 and saved["layers"][0]["ulysses"] == 4
    assert Plan.from_dict(saved) == plan


def test_version_1_files_cannot_name_ulysses_and_unknown_versions_are_refused():
    layer = {"tp": 1, "ulysses": 4, "dp": 2, "sp": "ulysses"}
    v1 = {"pp": 1, "stage_layers": [1], "global_batch": 8, "micro_batches": 1, "layers": [layer]}
    with pytest.raises(SpecError, match="ulysses is a version 2 field"):
        Plan.from_dict(v1)
    assert Plan.from_dict({**v1, "version": 2}).layers[0].ulysses == 4
    with pytest.raises(SpecError, match="version"):
        Plan.from_dict({**v1, "version": 3})


def test_galvatron_ulysses_layers_load_on_their_own_axis_and_round_trip():
    raw = {"pp_deg": 1, "tp_sizes_enc": "1,2", "tp_consecutive_flags": "1,1", "dp_types_enc": "1,0",
           "use_sp": "1,0", "sp_sizes_enc": "4,1", "checkpoint": "0,0", "global_bsz": 8, "chunks": 1,
           "default_dp_type": "zero2"}
    plan = plan_from_galvatron(raw, 8)
    uly, tp = plan.layers
    assert (uly.tp, uly.ulysses, uly.dp, uly.dp_type) == (1, 4, 2, "zero3")
    assert (tp.tp, tp.ulysses, tp.dp) == (2, 1, 4)
    back = plan_to_galvatron(plan)
    assert (back["tp_sizes_enc"], back["use_sp"], back["sp_sizes_enc"]) == ("1,2", "1,0", "4,1")
    # older Galvatron files give the Ulysses degree in tp_sizes_enc
    old = plan_from_galvatron({**raw, "tp_sizes_enc": "4,2", "sp_sizes_enc": "1,1"}, 8)
    assert old.layers[0] == uly
