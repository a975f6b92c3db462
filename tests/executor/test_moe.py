"""Mixture-of-experts blocks and expert parallelism: routing and dispatch permutations by hand,
MoE plans against the one-process reference (--check), broken expert parallelism that must
fail it, and the refusals."""
import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import specs
from executor import parallelize, train
from executor.checks import check_runnable
from executor.model import build_block
from executor.moe import capacity_mask, route
from executor.parallel import expert
from executor.run import run_plan
from specs import LayerStrategy as L
from specs import Plan, SpecError
from tests.executor.conftest import assert_matches_reference


@pytest.fixture(scope="module")
def tiny_moe():
    return specs.load_model("tiny-moe")


def with_moe(model, layers, **changes):
    """``model`` with ``changes`` to the MoESpec of the given layers."""
    new = [dataclasses.replace(l, moe=dataclasses.replace(l.moe, **changes)) if i in layers else l
           for i, l in enumerate(model.layers)]
    return dataclasses.replace(model, layers=tuple(new))


def moe_plan(layers, *, stage_layers=(4,), global_batch=8, micro_batches=1):
    return Plan(pp=len(stage_layers), stage_layers=tuple(stage_layers), layers=tuple(layers),
                global_batch=global_batch, micro_batches=micro_batches, model="tiny-moe")


# -- without processes -------------------------------------------------------------------------
def test_routing_is_mixtrals_softmax_over_the_top_k_logits():
    logits = torch.randn(10, 8, generator=torch.Generator().manual_seed(1))
    r = route(logits, top_k=2)
    assert r.counts.tolist() == torch.bincount(logits.topk(2).indices.flatten(), minlength=8).tolist()
    experts = torch.repeat_interleave(torch.arange(8), r.counts)
    for token in range(10):
        top = logits[token].topk(2)
        mine = r.token == token
        assert sorted(experts[mine].tolist()) == sorted(top.indices.tolist())
        want = dict(zip(top.indices.tolist(), F.softmax(top.values, dim=0).tolist()))
        for e, w in zip(experts[mine].tolist(), r.weight[mine].tolist()):
            assert w == pytest.approx(want[e], abs=1e-6)


def test_capacity_keeps_the_first_arrivals_of_each_sequence():
    # two sequences of 3 tokens, top-1 over 2 experts, capacity 2 per expert and sequence
    chosen = torch.tensor([[0], [0], [0], [1], [0], [1]])
    assert capacity_mask(chosen, 2, 2, 3).flatten().tolist() == [True, True, False, True, True, True]


def test_received_rows_are_regrouped_expert_after_expert():
    # from rank 0: 1 row for local expert 0, 2 for expert 1; from rank 1: 3 rows for expert 0
    order = expert.expert_major_order(torch.tensor([[1, 2], [3, 0]]))
    assert order.tolist() == [0, 3, 4, 5, 1, 2]


def test_moe_block_matches_a_per_token_loop(tiny_moe):
    """The sorted, batched expert computation equals each token summing its k experts."""
    model = with_moe(tiny_moe, {0}, num_shared_experts=1, shared_expert_gate=True, router_bias=True)
    moe = build_block(model, 0, seed=0).mlp
    x = torch.randn(2, 5, 128, generator=torch.Generator().manual_seed(2))
    got = moe(x)
    e = moe.experts
    for b in range(2):
        for s in range(5):
            t = x[b, s]
            top = moe.router(t).topk(2)
            want = sum(w * ((F.silu(t @ e.gate[i]) * (t @ e.up[i])) @ e.down[i])
                       for w, i in zip(F.softmax(top.values, dim=0), top.indices))
            want = want + torch.sigmoid(moe.shared_gate(t)) * moe.shared(t)
            torch.testing.assert_close(got[b, s], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy, message", [
    (L(tp=2, dp=2, ep=2, expert_tp=1), "layer 0: expert_tp 1 != tp 2"),
    (L(dp=4, ep=2, dp_type="zero3"),
     r"executor cannot run layer 0: expert_dp_type zero3 \(supported: ddp, zero1, zero2\)"),
    (L(tp=2, dp=2, ep=2, sp="megatron"), "layer 0: sp megatron with tp 2 on a MoE layer"),
])
def test_what_the_executor_cannot_run_on_experts_is_refused_in_one_line(tiny_moe, strategy, message):
    with pytest.raises(SpecError, match=message):
        check_runnable(tiny_moe, moe_plan([strategy] * 4), 4)


# -- launched ----------------------------------------------------------------------------------
MIXED = [
    L(dp=4, ep=4),                                    # one expert pair per rank, no expert dp
    L(tp=2, dp=2, tp_consecutive=False, ep=2),        # experts split over strided TP groups too
    L(dp=4, ep=2, dp_type="zero2"),                   # expert dp 2, experts and dense part ZeRO-2
    L(dp=4, ep=2, dp_type="zero3", expert_dp_type="zero1"),  # FSDP dense part, ZeRO-1 experts
]


def test_mixed_expert_parallel_plan_matches_the_reference_on_4_ranks(tiny_moe):
    """ep 4, ep 2 with strided tp 2, ep 2 with expert dp under ZeRO-1/2 beside a ZeRO-3 dense
    part, relayouts between them; layers 2-3 with a shared expert, its gate, a router bias and
    a capacity that drops tokens. Per-rank state bytes: experts / (ep * tp)."""
    model = with_moe(tiny_moe, {2, 3}, num_shared_experts=1, shared_expert_gate=True, router_bias=True,
                     capacity_factor=1.0)
    assert_matches_reference(moe_plan(MIXED, micro_batches=2), model, 4)


def wrong_expert_group(rank, world_size, model, plan, cfg):
    """Expert gradients summed over the dense data-parallel group (ranks holding other experts)."""
    real = parallelize.apply_ep

    def apply_ep(*args, **kwargs):
        shard = real(*args, **kwargs)
        if shard is not None:
            shard.group = dist.group.WORLD  # here the layer's dense dp group
        return shard

    parallelize.apply_ep = apply_ep
    return train.worker(rank, world_size, model, plan, cfg)


def unsorted_dispatch(rank, world_size, model, plan, cfg):
    """Received rows go to the local experts in arrival order (no regrouping by expert)."""
    expert.expert_major_order = lambda counts: torch.arange(int(counts.sum()))
    return train.worker(rank, world_size, model, plan, cfg)


def experts_replicated(rank, world_size, model, plan, cfg):
    """Every rank holds all experts (ep 1: the same numbers) but reports the plan's split."""
    real = train.parallelize

    def parallelize(model, plan, *args, **kwargs):
        pm = real(model, dataclasses.replace(plan, layers=tuple(dataclasses.replace(s, ep=1) for s in plan.layers)),
                  *args, **kwargs)
        for unit in pm.units:
            if unit.name.endswith("experts"):
                s = plan.layers[int(unit.name.split()[1])]
                unit.numel, unit.dp = unit.numel // s.ep, s.expert_dp
        return pm

    train.parallelize = parallelize
    return train.worker(rank, world_size, model, plan, cfg)


def test_the_byte_check_sees_experts_that_are_not_split(tiny_moe):
    m = run_plan(moe_plan([L(dp=2, ep=2)] * 4, global_batch=4), tiny_moe, world_size=2, steps=2, check=True,
                 track_memory=False, timeout_s=180, rank_fn=experts_replicated)
    c = m.check
    assert not c.passed and max(c.grad_max_abs_diff, c.param_max_abs_diff) <= c.atol
    assert any(e.startswith("layer 0 experts (rank 0): holds") and e.endswith("ddp dp1)") for e in c.state_bytes_errors), \
        c.state_bytes_errors


@pytest.mark.parametrize("broken", [wrong_expert_group, pytest.param(unsorted_dispatch, marks=pytest.mark.slow)],
                         ids=["wrong-expert-group", "unsorted-dispatch"])
def test_the_check_fails_on_broken_expert_parallelism(tiny_moe, broken):
    m = run_plan(moe_plan([L(dp=2, ep=2)] * 4, global_batch=4), tiny_moe, world_size=2, steps=2, check=True,
                 track_memory=False, timeout_s=180, rank_fn=broken)
    c = m.check
    assert not c.passed and max(c.grad_max_abs_diff, c.param_max_abs_diff) > 1e-4
    assert not c.state_bytes_errors
    if broken is wrong_expert_group:  # the first forward is right: the expert gradients go astray
        assert "experts" in c.worst


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [L(dp=4, ep=2), L(dp=4, ep=4), L(tp=2, dp=2, ep=2)], ids=["ep2", "ep4", "tp2-ep2"])
def test_uniform_expert_parallel_plans_on_4_ranks(tiny_moe, strategy):
    assert_matches_reference(moe_plan([strategy] * 4), tiny_moe, 4)


@pytest.mark.slow
def test_expert_parallel_inside_pipeline_stages_with_recompute_on_4_ranks(tiny_moe):
    plan = moe_plan([L(dp=2, ep=2), L(dp=2, ep=2, recompute="full"), L(tp=2, ep=1), L(dp=2, ep=2, dp_type="zero1", expert_dp_type="ddp")],
                    stage_layers=(2, 2), micro_batches=2)
    assert_matches_reference(plan, tiny_moe, 4)
