"""The search space: Galvatron's decision tree counts, presets, switches, budgets."""
from __future__ import annotations

import pytest

from planners import Budget, SearchSpace
from planners.space import combos, layer_allows
from specs import SpecError, load_cluster, load_model


def _count(space: SearchSpace, world: int = 8) -> int:
    return sum(len(space.stage_strategies(world // pp)) for pp in (1, 2, 4, 8))


def test_paper_space_has_22_strategies_on_8_gpus_and_44_with_checkpointing():
    paper = SearchSpace.preset("galvatron")
    assert _count(paper) == 22
    assert _count(paper.widened(checkpoint=True)) == 44


def test_decision_tree_rules():
    for s in SearchSpace().stage_strategies(8):
        assert s.tp * s.dp == 8
        if s.dp == 1:
            assert s.dp_type == "ddp"
        if s.tp == 1 or s.dp == 1:
            assert s.tp_consecutive
    assert {s.tp for s in SearchSpace(max_tp=2).stage_strategies(8)} == {1, 2}


def test_presets_restrict():
    model, cluster = load_model("bert-huge-32"), load_cluster("titan-8")
    assert SearchSpace.preset("dp+tp").pp_choices(model, cluster) == [1]
    assert {s.tp for s in SearchSpace.preset("dp+pp").stage_strategies(4)} == {1}
    assert {s.dp_type for s in SearchSpace.preset("3d").stage_strategies(8)} == {"ddp"}
    zero2 = SearchSpace.preset("galvatron").widened(zero2=True)
    assert "zero2" in {s.dp_type for s in zero2.stage_strategies(8)}
    with pytest.raises(SpecError, match="unknown preset"):
        SearchSpace.preset("4d")


def test_combos_respect_divisibility_and_1f1b():
    model, cluster = load_model("bert-huge-32"), load_cluster("titan-8")
    seen = list(combos(model, cluster, (8,), SearchSpace()))
    assert seen
    for c in seen:
        assert 8 % c.micro_batches == 0 and c.micro_batches >= c.pp
        assert (cluster.world_size // c.pp) % c.vocab_tp == 0
    # 30522 is not a multiple of 4: offered anyway, the vocabulary is padded as Megatron pads it
    assert 4 in {c.vocab_tp for c in seen}


def test_galvatron2_and_full_presets_add_the_new_dimensions():
    g2 = SearchSpace.preset("galvatron2").stage_strategies(8)
    assert {s.sp for s in g2} == {"none", "megatron", "ulysses"} and {s.recompute for s in g2} == {"none", "full"}
    assert all(s.sp == "none" for s in g2 if s.degrees.split == 1)  # sp needs a tp or Ulysses group
    assert all(s.tp == 1 and s.ulysses > 1 for s in g2 if s.sp == "ulysses")  # Ulysses on its own axis
    # Ulysses shards states over its whole group: ZeRO with dp 1 is a choice there
    assert any(s.ulysses > 1 and s.dp == 1 and s.dp_type == "zero3" for s in g2)
    full = SearchSpace.preset("full")
    assert "selective" in {s.recompute for s in full.stage_strategies(8)}
    assert full.virtual_stages == (1, 2, 4)
    model = load_model("bert-huge-32")
    assert {v.sp for v in full.vocab_choices(model, 8)} == {"none", "megatron", "ulysses"}
    assert {v.zero3 for v in full.vocab_choices(model, 8)} == {False, True}
    assert SearchSpace.preset("galvatron").vocab_choices(model, 8) == [(1, False, "none"), (2, False, "none"),
                                                                       (4, False, "none"), (8, False, "none")]


def test_caps_are_options_with_stated_defaults():
    space = SearchSpace()
    assert space.micro_batch_choices(1536, 8) == [8, 16, 32, 64]  # powers of two up to max_micro_batches 64
    lifted = SearchSpace(degrees="divisors", max_micro_batches=1536)
    assert 1536 in lifted.micro_batch_choices(1536, 8) and 24 in lifted.micro_batch_choices(1536, 8)
    assert lifted.micro_batch_choices(1536, 8, virtual_stages=2)[:3] == [8, 16, 24]  # multiples of pp
    model, cluster = load_model("bert-huge-32"), load_cluster("dgx-a100-80g:8")
    assert SearchSpace().pp_choices(model, cluster) == [1, 2, 4, 8]
    assert SearchSpace(max_pp=64).pp_choices(model, cluster) == [1, 2, 4, 8, 16, 32]  # pp <= 32 layers
    assert SearchSpace(degrees="divisors").tp_choices(6) == [1, 2, 3, 6]
    with pytest.raises(SpecError, match="degrees: must be one of powers_of_two, divisors"):
        SearchSpace(degrees="primes")
    # micro-batch counts may follow their own rule; the full preset takes every divisor (Megatron's
    # micro-batch size 1 at dp 16 on batch 1536 is 96 micro-batches), degrees stay powers of two
    full = SearchSpace.preset("full")
    assert 96 in full.micro_batch_choices(1536, 8) and 96 not in SearchSpace().micro_batch_choices(1536, 8)
    assert full.tp_choices(6) == [1, 2]
    with pytest.raises(SpecError, match="micro_batch_degrees: must be one of powers_of_two, divisors, got 'odd'"):
        SearchSpace(micro_batch_degrees="odd")


def test_layer_rules():
    layer = load_model("bert-huge-32").layers[0]  # 16 heads
    from specs import LayerStrategy
    assert layer_allows(layer, LayerStrategy(tp=2, dp=4), 32, 2)
    assert not layer_allows(layer, LayerStrategy(tp=2, dp=4), 12, 2)  # 12 % (4*2) != 0


@pytest.mark.parametrize("kwargs, field", [
    ({"memory_gib": -1}, "memory_gib"),
    ({"memory_gib": 8, "global_batch": 0}, "global_batch"),
    ({"memory_gib": 8, "global_batch_range": (64, 8)}, "global_batch_range"),
    ({"memory_gib": 8, "global_batch": 8, "global_batch_range": (8, 16)}, "global_batch"),
])
def test_budget_errors_name_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        Budget(**kwargs)
    assert str(err.value).startswith(field)


def test_budget_batch_candidates():
    assert Budget(memory_gib=8, global_batch_range=(24, 128)).global_batches() == (24, 32, 64, 128)
    assert Budget(memory_gib=8, global_batch=48).global_batches() == (48,)


def test_split_backward_schedules_are_searched_as_uniform_schedules():
    """zb_h1 splits the backward: its bubble depends on the layers' W, so it is not a table
    schedule; the full preset tries it (and the V-shapes) over uniform plans, and a cost model
    that scores 1f1b only (galvatron) leaves them out."""
    import cost_models
    with pytest.raises(SpecError, match=r"^schedule: must be one of gpipe, 1f1b \(interleaving is searched through "
                                        r"virtual_stages, the others through uniform_schedules\), got 'zb_h1'$"):
        SearchSpace(schedule="zb_h1")
    with pytest.raises(SpecError, match="uniform_schedules: must be among"):
        SearchSpace(uniform_schedules=("zb",))
    full = SearchSpace.preset("full")
    assert full.uniform_schedules == ("zb_h1", "zbv", "dualpipev")
    galvatron = cost_models.get("galvatron", load_cluster("dgx-a100-80g"))
    assert full.within(galvatron.capabilities).uniform_schedules == ()


def test_the_full_preset_searches_the_per_op_policy_only_where_the_cost_model_prices_it():
    import cost_models
    from specs import MEGATRON_RECOMPUTE, Recompute
    full, cluster = SearchSpace.preset("full"), load_cluster("dgx-h100:1")
    assert full.recompute == tuple(Recompute)
    assert full.within(cost_models.get("analytical", cluster).capabilities).recompute == MEGATRON_RECOMPUTE
    assert full.within(cost_models.get("analytical", cluster, stack="compile").capabilities).recompute == tuple(Recompute)
    assert SearchSpace.preset("moe").recompute == MEGATRON_RECOMPUTE
