"""galvatron's proven gap: on random instances (pp > 1, heterogeneous T5- and Swin-like models) the
MILP optimum lies inside [bound, galvatron's value]; a time limit stops a group's DP part-way
(test_time_limit.py: the limit at every other step)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import planners
from planners.base import Budget
from specs import EmbeddingSpec, HeadSpec, LayerSpec, ModelSpec
from tests.planners.random_instances import (
    KIB,
    SMALL_SPACE,
    RandomCostModel,
    tiny_cluster,
    tiny_model,
)

PIPE_SPACE = replace(SMALL_SPACE, max_pp=4, micro_batches=(2, 4), dp_types=("ddp", "zero1", "zero3"))
"""pp 1, 2 and 4 on 4 GPUs, two micro-batch counts, three dp types."""


def _layer(kind: str, seq: int, **extra) -> LayerSpec:
    return LayerSpec(kind=kind, hidden_size=64, num_heads=4, ffn_hidden_size=256, seq_len=seq, **extra)


def t5_like(enc: int, dec: int) -> ModelSpec:
    """Identical encoder blocks, then decoder blocks with cross attention (no sequence parallelism)."""
    layers = [_layer("t5_encoder", 16)] * enc + [_layer("t5_decoder", 17, cross_attention_seq_len=16)] * dec
    return ModelSpec(name=f"t5-like-{enc}-{dec}", embedding=EmbeddingSpec(hidden_size=64, vocab_size=64),
                     layers=tuple(layers), head=HeadSpec(hidden_size=64, output_size=64))


def swin_like(blocks: tuple[int, ...]) -> ModelSpec:
    """Stages of identical blocks, each stage's last block downsampling."""
    layers = []
    for i, count in enumerate(blocks):
        seq = 64 >> (2 * i)
        layers += [_layer("swin", seq)] * (count - 1) + [_layer("swin", seq, downsample_to=64)]
    return ModelSpec(name="swin-like", embedding=EmbeddingSpec(hidden_size=64, vocab_size=64),
                     layers=tuple(layers), head=HeadSpec(hidden_size=64, output_size=64))


def _case(seed: int):
    rng = np.random.default_rng(seed)
    model = [lambda: tiny_model(int(rng.integers(4, 7)), identical=bool(rng.random() < 0.5)),
             lambda: t5_like(int(rng.integers(2, 4)), int(rng.integers(2, 4))),
             lambda: swin_like((2, int(rng.integers(1, 3)), 1))][seed % 3]()
    cluster = tiny_cluster()
    budget = Budget(memory_gib=int(rng.integers(3000, 30000)) * KIB / 1024**3, global_batch=8)
    return model, cluster, RandomCostModel(cluster, seed), budget


def _check(seed: int) -> None:
    model, cluster, cm, budget = _case(seed)
    fast = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": PIPE_SPACE})
    ilp = planners.get("ilp").plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "warm_start": False})
    assert fast.feasible == ilp.feasible, (fast.message, ilp.message)
    if not fast.feasible:
        return
    assert ilp.stats.solver_status == "optimal"
    bound, gap = fast.stats.bound_s, fast.stats.gap
    assert bound is not None and gap is not None and 0.0 <= gap < 1.0
    assert bound <= ilp.iteration_time_s * (1 + 1e-9), (bound, ilp.iteration_time_s)
    assert ilp.iteration_time_s <= fast.iteration_time_s * (1 + 1e-9)
    assert gap == pytest.approx(1 - bound / fast.iteration_time_s, abs=1e-12)
    assert (fast.stats.solver_status == "optimal") == (gap == 0.0)
    if gap == 0.0:
        assert fast.iteration_time_s == pytest.approx(ilp.iteration_time_s, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
def test_ilp_optimum_lies_inside_the_proven_gap(seed):
    _check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 30))
def test_ilp_optimum_lies_inside_the_proven_gap_many(seed):
    _check(seed)


@pytest.mark.parametrize("seed", [3, 16])
def test_the_proof_closes_the_gap_fast_mode_leaves(seed):
    """Seeds where fast mode alone ends with a gap (6.2% and 6.0%): the exact DP run after the
    search on the groups left open proves the optimum, the ILP's; on seed 16 it also finds a
    faster plan than fast mode's."""
    model, cluster, cm, budget = _case(seed)
    unproven = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "prove_candidates": 0})
    proven = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": PIPE_SPACE})
    ilp = planners.get("ilp").plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "warm_start": False})
    assert unproven.stats.solver_status == "heuristic" and unproven.stats.gap > 0.05
    assert proven.stats.solver_status == "optimal" and proven.stats.gap == 0.0
    assert proven.iteration_time_s == pytest.approx(ilp.iteration_time_s, rel=1e-9)
    assert proven.iteration_time_s <= unproven.iteration_time_s
    if seed == 16:
        assert proven.iteration_time_s < unproven.iteration_time_s * 0.99


def test_a_proof_out_of_points_keeps_the_plan_and_the_gap():
    """A work budget too small for any proof stops it part-way: the plan and the bound are fast
    mode's, status heuristic, on every machine alike (pruned points, not seconds)."""
    model, cluster, cm, budget = _case(3)
    unproven = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "prove_candidates": 0})
    starved = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "prove_candidates": 5})
    assert starved.stats.solver_status == "heuristic"
    assert starved.plan == unproven.plan and starved.stats.gap == unproven.stats.gap


def test_the_case_builders_give_pipelines_and_heterogeneous_layers():
    kinds = {s % 3: len(_case(s)[0].layer_types()) for s in range(3)}
    assert kinds[1] == 2 and kinds[2] >= 3  # T5-like: two block types; Swin-like: a type per stage


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1", True])
def test_bad_time_limits_are_refused(bad):
    model, cluster, cm, budget = _case(0)
    with pytest.raises(Exception, match="time_limit_s"):
        planners.get("galvatron").plan(model, cluster, budget, cm, {"time_limit_s": bad})


def test_a_group_search_stops_part_way_at_the_deadline(monkeypatch):
    """The deadline is checked between a group's passes, not only between groups: a search whose
    limit passes inside its first group DP stops there and keeps that group's cheap bound."""
    from planners import segments
    from planners.outer import grouped_tables
    model, cluster, cm, budget = _case(1)
    budget = replace(budget, memory_gib=budget.memory_gib * 4)
    t = grouped_tables(model, cm, budget.memory_bytes, PIPE_SPACE, (budget.global_batch,))[-1]
    with pytest.raises(segments.DeadlinePassed):
        segments.GroupDP(t, exact=False, even=False, deadline=0.0).solve(next(iter(t.vocab)))
    calls = []
    real = segments.GroupDP.check_deadline

    def late_after_two(self, running=0):  # the clock passes the limit after two checks, wherever they are
        calls.append(1)
        if len(calls) > 2:
            raise segments.DeadlinePassed
        return real(self, running)
    monkeypatch.setattr(segments.GroupDP, "check_deadline", late_after_two)
    res = planners.get("galvatron").plan(model, cluster, budget, cm, {"space": PIPE_SPACE, "time_limit_s": 3600})
    assert res.feasible and res.stats.solver_status == "time_limit" and len(calls) >= 3
