"""Capabilities declared once per consumer: one check, one wording of the refusal everywhere."""
from __future__ import annotations

from dataclasses import replace

import pytest

import cost_models
from planners.space import SearchSpace
from specs import DPType, SequenceParallel, SpecError, load_cluster, load_model, uniform_plan
from specs.capabilities import (EVERYTHING, LAYER_AXES, OFF, PLAN_AXES, Capabilities, check_supported,
                                layer_supported)

ONE_F_ONE_B_ZERO = Capabilities(dp_type={DPType.ZERO2, DPType.ZERO3}, sp={"none", "megatron"},
                                schedule={"1f1b"}, expert_parallel={OFF})


@pytest.fixture(scope="module")
def gpt():
    return load_model("tiny-gpt")


def test_every_axis_has_one_reader():
    assert set(Capabilities.__dataclass_fields__) == set(LAYER_AXES) | set(PLAN_AXES)
    assert not set(LAYER_AXES) & set(PLAN_AXES)


def test_everything_passes_and_the_first_unsupported_value_is_named(gpt):
    plan = uniform_plan(gpt.num_layers, tp=2, dp=2, global_batch=8, dp_type="zero3", sp="ulysses")
    check_supported(plan, gpt, EVERYTHING, "anyone")
    with pytest.raises(SpecError) as err:
        check_supported(plan, gpt, ONE_F_ONE_B_ZERO, "toy cost model")
    assert str(err.value) == "toy cost model cannot run layer 0: sp ulysses (supported: none, megatron)"


def test_plan_axes_come_before_layers_and_unused_axes_are_not_checked(gpt):
    plan = uniform_plan(gpt.num_layers, dp=1, global_batch=8, schedule="gpipe")  # dp 1: dp_type not in use
    with pytest.raises(SpecError, match=r"^toy cost model cannot run the plan: schedule gpipe \(supported: 1f1b\)$"):
        check_supported(plan, gpt, ONE_F_ONE_B_ZERO, "toy cost model")
    check_supported(replace(plan, schedule="1f1b"), gpt, ONE_F_ONE_B_ZERO, "toy cost model")
    assert not layer_supported(gpt.layers[0], replace(plan.layers[0], dp=2), ONE_F_ONE_B_ZERO)


def test_the_galvatron_cost_model_refuses_in_the_shared_wording():
    cm = cost_models.get("galvatron", load_cluster("dgx-a100-80g"))
    model = cm.model_spec
    ddp = uniform_plan(model.num_layers, dp=8, global_batch=8)
    with pytest.raises(SpecError, match=r"^galvatron cost model cannot run layer 0: dp_type ddp "
                       r"\(supported: zero2, zero3\)$"):
        cm.plan_cost(model, ddp)
    megatron_vocab = replace(ddp, layers=tuple(replace(s, dp_type="zero2") for s in ddp.layers), vocab_tp=2,
                             vocab_sp=SequenceParallel.MEGATRON)
    with pytest.raises(SpecError, match=r"cannot run the plan: vocab_sp megatron \(supported: none, ulysses\)"):
        cm.plan_cost(model, megatron_vocab)


def test_planners_leave_out_what_the_cost_model_cannot_score():
    galvatron = cost_models.get("galvatron", load_cluster("dgx-a100-80g")).capabilities
    space = SearchSpace.preset("full").within(galvatron)
    assert set(space.dp_types) == {"zero2", "zero3"} and space.virtual_stages == (1,)
    assert SequenceParallel.MEGATRON not in space.vocab_sp and space.expert_parallel == (1,)
    assert SearchSpace.preset("full").within(EVERYTHING) == SearchSpace.preset("full")
    only_ddp = SearchSpace(dp_types=("ddp",))
    assert only_ddp.within(galvatron).dp_types == ("ddp",)  # never emptied: the cost model still refuses it
