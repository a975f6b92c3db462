"""Context parallelism on the plan: the cp degree and its communication type per layer, the
token order per plan, their validation, files and the capability readers."""
from dataclasses import replace

import pytest

from specs import (CPComm, CPLoadBalance, LayerStrategy, Plan, SpecError, load_cluster, load_model,
                   plan_from_galvatron, plan_to_galvatron, uniform_plan)
from specs.capabilities import Capabilities, check_supported

LLAMA = load_model("llama3-8b").with_seq_len(131072)  # 32 layers, 32 heads, 8 kv heads


def _plan(**kw) -> Plan:
    return uniform_plan(LLAMA.num_layers, global_batch=kw.pop("global_batch", 8), **kw)


def test_cp_is_a_factor_of_the_stage_and_of_the_gradient_sync():
    s = LayerStrategy(tp=8, cp=4, dp=2, sp="megatron", dp_type="zero1")
    d = s.degrees
    assert (d.cp, d.gpus, d.split, d.grad_sync, d.seq_split) == (4, 64, 32, 8, 32)
    _plan(tp=8, cp=4, dp=2, sp="megatron", dp_type="zero1").validate(LLAMA, load_cluster("dgx-h100:8"))


def test_the_sequence_must_split_into_2_cp_chunks():
    with pytest.raises(SpecError, match=r"^layer 0: seq 131072 not divisible by 2\*cp \(2\*6\)$"):
        _plan(cp=6, dp=4).validate(LLAMA, load_cluster("dgx-h100:3"))
    with pytest.raises(SpecError, match=r"^layer 0: seq 1000 not divisible by 2\*cp\*ulysses \(2\*4\*2\)$"):
        _plan(cp=4, ulysses=2, sp="ulysses", cp_comm="a2a+p2p").validate(
            LLAMA.with_seq_len(1000), load_cluster("dgx-h100"))


def test_a_million_tokens_is_a_valid_sequence():
    model = load_model("llama3-8b").with_seq_len(1 << 20)
    _plan(tp=8, cp=16, sp="megatron", global_batch=1).validate(model, load_cluster("dgx-h100:16"))


@pytest.mark.parametrize("kw, message", [
    (dict(cp_comm="all_gather", dp=8), r"cp_comm all_gather needs cp > 1 \(cp is 1\)"),
    (dict(cp=2, ulysses=4, sp="ulysses"), "cp_comm p2p with ulysses 4: Ulysses beside cp > 1 is cp_comm a2a\\+p2p"),
    (dict(cp=8, cp_comm="a2a+p2p"), "cp_comm a2a\\+p2p with ulysses 1"),
])
def test_the_comm_type_goes_with_its_axes(kw, message):
    with pytest.raises(SpecError, match=f"^layer 0: {message}"):
        _plan(**kw).validate(LLAMA, load_cluster("dgx-h100"))


def test_fields_round_trip_and_read_in_the_summary():
    plan = replace(_plan(tp=2, cp=2, dp=2, cp_comm="all_gather"), cp_load_balance="none")
    assert plan.cp_load_balance == CPLoadBalance.NONE and plan.layers[0].cp_comm == CPComm.ALL_GATHER
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.summary() == "pp1 m1 cp-order none | L0-31 tp2/dp2 cp2/ag"
    assert _plan(cp=8).summary() == "pp1 m1 | L0-31 tp1/dp1 cp8"
    with pytest.raises(SpecError, match="cp_comm"):
        LayerStrategy(cp=2, cp_comm="ring")


def test_consumers_refuse_cp_in_one_line():
    plan = _plan(cp=8)
    with pytest.raises(SpecError, match=r"^x cannot run layer 0: cp_comm p2p \(supported: nothing\)$"):
        check_supported(plan, LLAMA, Capabilities(cp_comm=frozenset()), "x")
    with pytest.raises(SpecError, match=r"^x cannot run the plan: cp_load_balance none \(supported: zigzag\)$"):
        check_supported(replace(plan, cp_load_balance="none"), LLAMA, Capabilities(cp_load_balance={"zigzag"}), "x")
    check_supported(_plan(dp=8), LLAMA, Capabilities(cp_comm=frozenset(), cp_load_balance=frozenset()), "x")


def test_galvatron_files_carry_cp_per_layer():
    plan = _plan(cp=8)
    raw = plan_to_galvatron(plan)
    assert raw["cp_sizes_enc"] == ",".join(["8"] * 32)
    assert plan_from_galvatron(raw, 8) == plan
    with pytest.raises(SpecError, match=r"^layer 0: cp_comm all_gather \(cp 8, ulysses 1\) has no field"):
        plan_to_galvatron(_plan(cp=8, cp_comm="all_gather"))
