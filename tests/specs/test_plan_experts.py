"""Plan: the expert-parallel fields of MoE layers (ep, expert_tp, expert_dp_type)."""
import json
from dataclasses import replace

import pytest

from specs import LayerStrategy, Plan, SpecError, load_cluster, load_model, plan_to_galvatron, uniform_plan

MOE = load_model("tiny-moe")      # 4 MoE layers, 8 experts, expert width 256
DENSE = load_model("tiny-llama")
CPU4 = load_cluster("cpu-4")


def moe_plan(**strategy):
    base = uniform_plan(MOE.num_layers, dp=4, global_batch=8, model="tiny-moe")
    layer = replace(base.layers[0], **strategy)
    return replace(base, layers=(layer,) * MOE.num_layers)


def test_expert_fields_round_trip_and_old_files_load():
    plan = moe_plan(ep=2, expert_tp=2, expert_dp_type="zero1")
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    old = json.loads(uniform_plan(MOE.num_layers, dp=4, global_batch=8).to_json())
    for layer in old["layers"]:
        for key in ("ep", "expert_tp", "expert_dp_type"):
            del layer[key]
    assert Plan.from_dict(old).layers[0].ep == 1


def test_expert_groups_follow_megatron_core():
    s = LayerStrategy(tp=2, dp=4, ep=4)
    assert (s.etp, s.expert_dp) == (2, 1)          # etp defaults to tp: ep carved from dp
    s = LayerStrategy(tp=2, dp=4, ep=8, expert_tp=1, dp_type="zero3")
    assert (s.etp, s.expert_dp, s.expert_dp_kind) == (1, 1, "zero3")
    assert LayerStrategy(ulysses=2, dp=2, sp="ulysses", ep=2).etp == 1   # Ulysses replicates weights


def test_valid_expert_plan_passes():
    moe_plan(ep=4).validate(MOE, CPU4)
    moe_plan(ep=2, expert_dp_type="zero2").validate(MOE, CPU4)


@pytest.mark.parametrize("strategy, message", [
    (dict(ep=3), "ep 3 does not divide num_experts 8"),
    (dict(ep=8), "ep(8)*expert_tp(1) = 8 does not divide the 4 GPUs per stage"),
    (dict(ep=4, expert_dp_type="zero3"), "expert dp type zero3 needs expert data-parallel replicas: "
                                         "4 GPUs / (ep 4 * expert_tp 1) = 1"),
    (dict(expert_tp=3), "ep(1)*expert_tp(3) = 3 does not divide the 4 GPUs per stage"),
])
def test_bad_expert_splits_name_the_numbers(strategy, message):
    with pytest.raises(SpecError, match="layer 0") as err:
        moe_plan(**strategy).validate(MOE, CPU4)
    assert message in str(err.value)


def test_expert_fields_on_a_dense_layer_are_refused():
    plan = uniform_plan(DENSE.num_layers, dp=4, global_batch=8)
    plan = replace(plan, layers=tuple(replace(s, ep=2) for s in plan.layers))
    with pytest.raises(SpecError, match="set on a llama layer without experts"):
        plan.validate(DENSE, CPU4)


@pytest.mark.parametrize("bad, field", [(dict(ep=0), "ep"), (dict(expert_tp=-1), "expert_tp"),
                                        (dict(expert_tp=True), "expert_tp"), (dict(expert_dp_type="zero4"),
                                                                              "expert_dp_type")])
def test_malformed_expert_fields(bad, field):
    with pytest.raises(SpecError) as err:
        LayerStrategy(dp=4, **bad)
    assert err.value.field == field


def test_short_names_the_expert_split_and_galvatron_export_refuses_it():
    assert moe_plan(ep=2, expert_dp_type="zero1").layers[0].short() == "tp1/dp4 ep2 e:zero1"
    with pytest.raises(SpecError, match="expert parallelism has no field"):
        plan_to_galvatron(moe_plan(ep=2))
