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
        assert model.embedding.vocab_size % c.vocab_tp == 0


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
