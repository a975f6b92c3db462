"""Layouts are views of specs.grid's RankGrid, and plans the executor cannot run are rejected."""
import dataclasses

import pytest

import specs
from executor.checks import check_runnable
from executor.parallel.layout import Layout
from specs import LayerStrategy, SpecError, stage_grid, uniform_plan


@pytest.mark.parametrize("tp,dp,consecutive", [(2, 2, True), (2, 2, False), (2, 4, False), (4, 2, True), (1, 8, True)])
def test_layout_is_the_grid_s_batch_slices(tp, dp, consecutive):
    layout, grid = Layout(tp=tp, dp=dp, consecutive=consecutive), stage_grid(0, tp * dp, tp, consecutive)
    for d in range(dp):  # the d-th TP group holds batch slice d
        group = grid.groups("tp")[d]
        assert tuple(layout.local_rank(d, t) for t in range(tp)) == group
        assert {layout.dp_index(r) for r in group} == {d}
    for group in grid.groups("dp"):
        assert len({layout.tp_index(r) for r in group}) == 1


def test_a_ulysses_layer_s_layout_is_its_ulysses_group():
    s = LayerStrategy(ulysses=4, dp=2, sp="ulysses")
    assert Layout.of(s) == Layout(tp=4, dp=2)


def test_only_different_slices_need_a_relayout():
    a, b = Layout(tp=2, dp=2), Layout(tp=2, dp=2, consecutive=False)
    assert not a.same_slices(b)
    assert a.same_slices(Layout(tp=2, dp=2))
    assert Layout(tp=1, dp=4).same_slices(Layout(tp=1, dp=4, consecutive=False))
    assert not Layout(tp=4, dp=1).same_slices(Layout(tp=1, dp=4))


@pytest.mark.parametrize("plan_kwargs,world,message", [
    (dict(tp=8, global_batch=8), 8, r"tp\(8\) does not divide heads\(4\)"),
    (dict(dp=4, global_batch=6), 4, r"global_batch\(6\) is not divisible"),
    (dict(dp=2, pp=2, global_batch=8, micro_batches=1), 4, r"1f1b needs micro_batches\(1\) >= pp\(2\)"),
    (dict(dp=2, global_batch=8), 4, r"dp\(2\) \* tp\(1\) = 2 != 4 GPUs of stage 0"),
])
def test_unrunnable_plans_are_rejected_with_the_reason(tiny_gpt, plan_kwargs, world, message):
    with pytest.raises(SpecError, match=message):
        check_runnable(tiny_gpt, uniform_plan(4, model="tiny-gpt", **plan_kwargs), world)


def test_kv_heads_must_split(tiny_gpt):
    llama = specs.load_model("tiny-llama")  # 8 heads, 4 kv heads
    with pytest.raises(SpecError, match=r"tp\(8\) does not divide kv heads\(4\)"):
        check_runnable(llama, uniform_plan(4, tp=8, global_batch=8), 8)


def test_layers_the_blocks_cannot_build_are_refused():
    moe = specs.load_model("tiny-moe")
    check_runnable(moe, uniform_plan(4, global_batch=2), 1)  # experts: executor/moe.py
    all_biases = {"bias": True, "qkv_bias": True, "out_bias": True, "mlp_bias": True}
    biased = dataclasses.replace(moe, layers=tuple(dataclasses.replace(l, **all_biases) for l in moe.layers))
    with pytest.raises(SpecError, match=r"layer 0: the executor's experts are SwiGLU without biases"):
        check_runnable(biased, uniform_plan(4, global_batch=2), 1)
    windowed = moe.with_seq_len(64)
    layers = tuple(dataclasses.replace(l, kind="llama", moe=None, sliding_window=16) for l in windowed.layers)
    with pytest.raises(SpecError, match=r"sliding_window\(16\)"):
        check_runnable(dataclasses.replace(windowed, layers=layers), uniform_plan(4, global_batch=2), 1)


def test_a_broken_layer_chain_is_rejected(tiny_gpt):
    layers = list(tiny_gpt.layers)
    layers[2] = dataclasses.replace(layers[2], hidden_size=64, num_heads=4, ffn_hidden_size=256)
    broken = dataclasses.replace(tiny_gpt, layers=tuple(layers))
    with pytest.raises(SpecError, match=r"layer 2: hidden_size\(64\) != previous output width\(128\)"):
        check_runnable(broken, uniform_plan(4, global_batch=2), 1)


def test_sequence_parallel_refused_where_the_block_cannot_shard_the_sequence():
    t5 = specs.load_model("t5-large-48").scaled(hidden_size=64, num_layers=2, seq_len=16)
    plan = uniform_plan(2, tp=2, global_batch=2)
    plan = dataclasses.replace(plan, layers=tuple(dataclasses.replace(s, sp="megatron") for s in plan.layers))
    with pytest.raises(SpecError, match="layer 1: sp megatron is not modelled for blocks with cross-attention"):
        check_runnable(t5, plan, 2)


def test_a_token_models_vocabulary_runs_in_its_own_layout(tiny_gpt):
    """vocab_tp 1 under tp 2 layers: the embedding and head run data parallel over the stage's
    two ranks (the plan's vocabulary layout, as the cost models charge it), with relayouts to
    the layers; a plan whose layers are in that layout needs none, nor does a patch model."""
    from executor.parallel.vocab import vocab_split
    tp2 = uniform_plan(tiny_gpt.num_layers, tp=2, global_batch=4, model="tiny-gpt", cluster="cpu-2")
    split = vocab_split(tp2, tiny_gpt, 2)
    assert split is not None and split.layout == Layout(tp=1, dp=2) and not split.sharded
    assert vocab_split(uniform_plan(tiny_gpt.num_layers, dp=2, global_batch=4), tiny_gpt, 2) is None
    # over 4 ranks the vocabulary layout is dp 4: a micro-batch of 2 cannot be split there
    tp4 = dict(tp=4, micro_batches=2, model="tiny-gpt", cluster="cpu-4")
    assert vocab_split(uniform_plan(tiny_gpt.num_layers, global_batch=4, **tp4), tiny_gpt, 4) is None
    assert vocab_split(uniform_plan(tiny_gpt.num_layers, global_batch=8, **tp4), tiny_gpt, 4).layout == Layout(tp=1, dp=4)
    vit = specs.load_model("vit-huge-32").scaled(num_layers=2)
    assert vocab_split(uniform_plan(2, tp=2, global_batch=4), vit, 2) is None
