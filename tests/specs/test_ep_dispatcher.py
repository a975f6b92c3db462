"""Plan.ep_dispatcher: a validated choice of the plan, written to files only when not the default and
refused in one line by the consumers that do not run it; MoESpec's routing locality read from
DeepSeek's config."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specs import EPDispatcher, MoESpec, Plan, SpecError, load_cluster, load_model, uniform_plan
from specs.capabilities import ALL_TO_ALL_ONLY, Capabilities, check_supported
from specs.hf_config import model_from_dict


def _moe_plan(**kw) -> tuple:
    model = load_model("deepseek-v3")
    plan = uniform_plan(model.num_layers, dp=64, pp=1, global_batch=64)
    layers = tuple(replace(s, ep=8) if spec.moe is not None else s for s, spec in zip(plan.layers, model.layers))
    return model, replace(plan, layers=layers, **kw)


def test_the_choice_round_trips_and_is_written_only_when_not_the_default():
    _, plan = _moe_plan(ep_dispatcher="deepep")
    assert plan.ep_dispatcher == EPDispatcher.DEEPEP and plan.to_dict()["ep_dispatcher"] == "deepep"
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    plain = replace(plan, ep_dispatcher="all_to_all")
    assert "ep_dispatcher" not in plain.to_dict()  # files (and plan hashes) of today's plans are unchanged
    assert "deepep" in plan.summary() and "deepep" not in plain.summary()
    old = {"pp": 1, "stage_layers": [2], "layers": [{"dp": 2, "ep": 2}] * 2, "global_batch": 2, "micro_batches": 1}
    assert Plan.from_dict(old).ep_dispatcher == EPDispatcher.ALL_TO_ALL


def test_a_plan_that_cannot_use_deepep_is_refused_in_one_line():
    with pytest.raises(SpecError) as err:
        uniform_plan(4, dp=8, global_batch=8, ep_dispatcher="deepep")
    assert str(err.value) == ("ep_dispatcher: deepep needs a layer with ep > 1 (ep 1 on every layer): with no expert "
                              "split there is nothing to dispatch")
    with pytest.raises(SpecError, match="ep_dispatcher: must be one of all_to_all, deepep; got 'nccl'"):
        _moe_plan(ep_dispatcher="nccl")
    raw = _moe_plan(ep_dispatcher="deepep")[1].to_dict() | {"ep_dispatcher": "hybridep"}
    with pytest.raises(SpecError, match="ep_dispatcher"):
        Plan.from_dict(raw)


def test_deepep_needs_nvlink_inside_a_node():
    model, plan = _moe_plan(ep_dispatcher="deepep")
    plan.validate(model, load_cluster("dgx-h100:8"))
    cluster = load_cluster("dgx-h100:8")
    slow = replace(cluster, intra_node=replace(cluster.intra_node, kind="pcie"))
    with pytest.raises(SpecError) as err:
        plan.validate(model, slow)
    assert str(err.value).startswith("ep_dispatcher: deepep needs NVLink between a node's GPUs")
    assert str(err.value).endswith("intra-node link is pcie")


def test_consumers_without_it_refuse_it_in_the_shared_wording():
    model, plan = _moe_plan(ep_dispatcher="deepep")
    check_supported(replace(plan, ep_dispatcher="all_to_all"), model, Capabilities(ep_dispatcher=ALL_TO_ALL_ONLY), "x")
    with pytest.raises(SpecError) as err:
        check_supported(plan, model, Capabilities(ep_dispatcher=ALL_TO_ALL_ONLY), "executor")
    assert str(err.value) == "executor cannot run the plan: ep_dispatcher deepep (supported: all_to_all)"
    dense = uniform_plan(4, dp=8, global_batch=8)  # no ep > 1 layer: the axis is not in use
    check_supported(dense, load_model("tiny-gpt"), Capabilities(ep_dispatcher=frozenset()), "x")
    from cost_models.galvatron import GalvatronModel
    from cost_models.profiled import ProfiledModel
    from executor.unsupported import CAPABILITIES
    for capabilities in (CAPABILITIES, ProfiledModel.capabilities, GalvatronModel.capabilities):
        assert capabilities.ep_dispatcher == ALL_TO_ALL_ONLY


def test_deepseek_group_limited_routing_is_read_from_its_config():
    moe = next(spec.moe for spec in load_model("deepseek-v3").layers if spec.moe is not None)
    assert (moe.expert_groups, moe.groups_per_token, moe.routing, moe.group_limited) == (8, 4, "learned", True)
    base = json.loads(open("specs/zoo/models/deepseek-v3.json").read())
    for raw, want in [({"topk_method": "greedy"}, (1, None)), ({"n_group": 1, "topk_group": 1}, (1, None)),
                      ({"topk_group": 8}, (8, None)), ({"n_group": 4, "topk_group": 2}, (4, 2))]:
        moe = next(s.moe for s in model_from_dict(base | raw).layers if s.moe is not None)
        assert (moe.expert_groups, moe.groups_per_token) == want
    mixtral = next(s.moe for s in load_model("mixtral-8x7b").layers if s.moe is not None)
    assert (mixtral.expert_groups, mixtral.groups_per_token) == (1, None) and not mixtral.group_limited


@pytest.mark.parametrize("kw, words", [
    ({"expert_groups": 3}, "moe.expert_groups: 3 does not divide num_experts(256)"),
    ({"expert_groups": 8, "groups_per_token": 9}, "moe.groups_per_token: 9 > expert_groups(8)"),
    ({"expert_groups": 64, "groups_per_token": 1}, "moe.groups_per_token: 1 groups of 4 experts hold 4 < top_k(8)"),
    ({"routing": "random"}, "moe.routing: must be one of learned, fake_balanced; got 'random'"),
])
def test_bad_routing_fields_are_one_line(kw, words):
    with pytest.raises(SpecError) as err:
        MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, **kw)
    assert str(err.value) == words
