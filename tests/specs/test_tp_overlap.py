"""Plan.tp_comm_overlap: a validated choice of the plan, written to files only when on, and refused in
one line by the consumers that do not run it."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specs import Plan, SpecError, load_model, uniform_plan
from specs.capabilities import NO_TP_OVERLAP, Capabilities, check_supported


def _overlapped(**kw) -> Plan:
    args = dict(tp=2, global_batch=4, sp="megatron", stack="megatron-te", tp_comm_overlap=True) | kw
    return uniform_plan(4, **args)


def test_the_choice_round_trips_and_is_written_only_when_on():
    plan = _overlapped()
    assert plan.to_dict()["tp_comm_overlap"] is True
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    off = replace(plan, tp_comm_overlap=False)
    assert "tp_comm_overlap" not in off.to_dict()  # files (and plan hashes) of plans without it are unchanged
    assert Plan.from_dict(off.to_dict()).tp_comm_overlap is False
    assert "tp-overlap" in plan.summary() and "tp-overlap" not in off.summary()


def test_an_old_plan_file_without_the_field_loads_with_it_off():
    old = {"pp": 1, "stage_layers": [2], "layers": [{"tp": 2, "sp": "megatron"}] * 2, "global_batch": 2,
           "micro_batches": 1}
    assert Plan.from_dict(old).tp_comm_overlap is False


@pytest.mark.parametrize("kw, words", [
    ({"stack": None}, "tp_comm_overlap: true needs a stack that runs it (megatron-te, compile), got none stated"),
    ({"stack": "eager"}, "tp_comm_overlap: true needs a stack that runs it (megatron-te, compile), got eager"),
    ({"tp": 1, "sp": "none"}, "tp_comm_overlap: true needs a layer with tp > 1 (no layer has one)"),
    ({"sp": "none"}, "tp_comm_overlap: true needs sp megatron on every tp > 1 layer: layer 0 has tp 2, sp none"),
    ({"tp_comm_overlap": "yes"}, "tp_comm_overlap: must be true or false, got 'yes'"),
])
def test_a_plan_that_cannot_overlap_is_refused_in_one_line(kw, words):
    with pytest.raises(SpecError) as err:
        _overlapped(**kw)
    assert str(err.value) == words


def test_a_compile_plan_may_overlap_and_the_file_schema_takes_the_field():
    assert _overlapped(stack="compile").tp_comm_overlap
    raw = _overlapped().to_dict() | {"tp_comm_overlap": "on"}
    with pytest.raises(SpecError, match="tp_comm_overlap"):
        Plan.from_dict(raw)


def test_consumers_without_it_refuse_it_in_the_shared_wording():
    model = load_model("tiny-gpt")
    plan = uniform_plan(model.num_layers, tp=2, global_batch=4, sp="megatron", stack="megatron-te",
                        tp_comm_overlap=True)
    check_supported(replace(plan, tp_comm_overlap=False), model, Capabilities(tp_comm_overlap=NO_TP_OVERLAP), "x")
    with pytest.raises(SpecError) as err:
        check_supported(plan, model, Capabilities(tp_comm_overlap=NO_TP_OVERLAP), "executor")
    assert str(err.value) == "executor cannot run the plan: tp_comm_overlap on (supported: off)"
    # the executor, the profiled and the Galvatron cost models declare it (their refusals: this wording)
    from cost_models.galvatron import GalvatronModel
    from cost_models.profiled import ProfiledModel
    from executor.unsupported import CAPABILITIES
    for capabilities in (CAPABILITIES, ProfiledModel.capabilities, GalvatronModel.capabilities):
        assert capabilities.tp_comm_overlap == NO_TP_OVERLAP
