"""The speed-ups of issue 16 change no answer: Pareto pruning (also through each level's own
staircase first) keeps exactly the points a brute-force dominance check keeps, relayouts asked
once per layout pair, stage questions asked at an equivalent first rank (pipeline sends: moved
by whole nodes) and the vocabulary's relayouts asked once per layout class give the true tables."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import cost_models
from planners import pareto
from planners.outer import grouped_tables
from planners.space import SearchSpace
from planners.tables import _mbs, canonical_first_rank
from specs import load_cluster, load_model


def _brute_force(level, mem, cost):
    """Sorted by (mem, cost, level), dominated iff an earlier point has level <= and cost <=."""
    order = np.lexsort((level, cost, mem))
    keep = [i for p, i in enumerate(order)
            if not any(level[j] <= level[i] and cost[j] <= cost[i] for j in order[:p])]
    return np.array(keep, dtype=int)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fronts_first", [False, True])
@pytest.mark.parametrize("grid_first", [False, True])
def test_pruning_keeps_exactly_the_non_dominated_points(seed, fronts_first, grid_first, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    level = rng.integers(0, int(rng.integers(1, 12)), n)
    mem, cost = rng.integers(0, 40, n).astype(float), rng.integers(0, 40, n).astype(float)  # many ties
    monkeypatch.setattr(pareto, "LEVEL_FRONTS_ABOVE", 0 if fronts_first else 10**9)
    monkeypatch.setattr(pareto, "GRID_ABOVE", 1 if grid_first else 10**9)
    monkeypatch.setattr(pareto, "GRID_BUCKETS", int(rng.integers(1, 50)))
    assert np.array_equal(pareto.prune_fast(level, mem, cost), _brute_force(level, mem, cost))


def _cluster(name: str):
    """A zoo cluster, or 'trays': four 4-GPU nodes in NVLink domains of two (ranks move by whole domains)."""
    if name == "trays":
        return dataclasses.replace(load_cluster("gb200-nvl72"), scale_up_domain_gpus=8).with_nodes(4)
    return load_cluster(name)


@pytest.mark.parametrize("model, cluster", [("llama2-7b", "dgx-a100-80g:2"), ("t5-large-48", "titan-16"),
                                            ("llama2-7b", "trays")])
def test_tables_equal_the_cost_models_answers_at_the_true_ranks(model, cluster):
    model, cluster = load_model(model).scaled(num_layers=4), _cluster(cluster)
    cm = cost_models.get("analytical", cluster)
    tables = grouped_tables(model, cm, 40 * 2**30, SearchSpace.preset("full"), (32,))
    checked = sends = 0
    for t in tables[::3]:
        gpus = cluster.world_size // t.combo.pp
        for st in t.stages:
            assert canonical_first_rank(cm, st.first_rank, gpus) <= st.first_rank
            for ti, layer in enumerate(t.types):
                for si in np.flatnonzero(t.allowed[ti])[::4]:
                    s = t.strategies[si]
                    mbs = _mbs(t.combo, s)
                    lt = cm.layer_time(layer, s, mbs, t.combo.micro_batches, st.first_rank)
                    assert st.time_s[ti, si] == lt.micro_batch_s and st.tail_s[ti, si] == lt.tail_s
                    if st.first_rank + gpus < cluster.world_size:  # sends asked moved by whole nodes
                        nxt = st.first_rank + gpus
                        assert st.send_next_s[ti, si] == cm.pipeline_send_time(layer, s, mbs, st.first_rank, nxt, gpus)
                        assert st.send_prev_s[ti, si] == cm.pipeline_send_time(layer, s, mbs, nxt, st.first_rank, gpus)
                        sends += 1
                    lm = cm.layer_memory_in(layer, s, mbs, st.in_flight, t.combo.micro_batches)
                    assert st.memory_bytes[ti, si] == lm.states_bytes + lm.activations_bytes  # linear_in_flight
                    assert st.temp_bytes[ti, si] == lm.temporary_bytes
                    for ui in range(0, len(t.strategies), 5):
                        u = t.strategies[ui]
                        assert st.trans_s[ti, si, ui] == cm.transition_time(layer, s, u, mbs, st.first_rank)
                        checked += 1
    assert checked > 1000 and sends > 100


@pytest.mark.parametrize("name", ["analytical", "galvatron"])
def test_stages_holding_neither_vocab_end_cost_alike(name):
    """The rank_symmetric contract the tables lean on: vocab_cost is the same on every middle stage."""
    from specs import LayerStrategy, Plan
    model, cluster = load_model("bert-huge-32").scaled(num_layers=8), load_cluster("titan-8")
    cm = cost_models.get(name, cluster)
    assert cm.rank_symmetric
    plan = Plan(pp=4, stage_layers=(2, 2, 2, 2), layers=(LayerStrategy(tp=2, dp=1, dp_type="zero3"),) * 8,
                global_batch=8, micro_batches=4, vocab_tp=2)
    first, *middle, last = [cm.vocab_cost(model, plan, k, cluster.world_size) for k in range(4)]
    assert middle[0] == middle[1] and middle[0] != first


def test_completion_bound_is_the_knapsack_lp_worked_by_hand():
    """Three strategies (memory, m t + d) = (1, 10), (2, 6), (4, 5); hull slopes -4 and -1/2. Two
    later layers in 4 bytes: both at (2, 6), 12; in 3 bytes: the LP mixes (1, 10) and (2, 6),
    8 a layer, 16 (also the integer optimum 10 + 6); in 10 bytes: memory is free, 2 x 5."""
    c = pareto.Completion.of(np.array([[10.0, 6.0, 5.0]]), np.array([[1.0, 2.0, 4.0]]), np.zeros(3, dtype=int))
    assert np.allclose(c.prices, [0.0, 0.5, 4.0])
    assert np.allclose(c.least(0, np.array([4.0, 3.0, 10.0])), [12.0, 16.0, 10.0])
    assert np.allclose(c.least(1, np.array([1.0, 2.0])), [10.0, 6.0]) and c.least(2, np.array([0.0]))[0] == 0
    assert list(c.memory_after) == [2.0, 1.0, 0.0]


def test_vocab_relayout_deltas_asked_per_layout_class_equal_each_strategys_answer():
    """tables._relayout_delta asks one strategy per layout class, once for the vocab choices that
    differ only in ZeRO-3: every strategy's delta is the cost model's own answer for it under
    each vocab choice, less the probe layer's."""
    from planners.tables import _cached_probe_plan, _relayout_delta, layout_classes
    from specs import DPType
    model, cluster = load_model("llama2-7b").scaled(num_layers=4), load_cluster("dgx-a100-80g:2")
    cm = cost_models.get("analytical", cluster)
    checked = 0
    for t in grouped_tables(model, cm, 40 * 2**30, SearchSpace.preset("full"), (32,))[::4]:
        shared = {"layouts": layout_classes(t.strategies)}  # the group's, as tables._complete keeps it
        for v in t.vocab:
            combo = dataclasses.replace(t.combo, vocab=v)
            probe = _cached_probe_plan(cm, model, combo, DPType.DDP, DPType.DDP)
            for index in (0, model.num_layers - 1):
                got = _relayout_delta(cm, model, combo, index, t.strategies, shared)
                base = cm.vocab_relayout_time(model, probe, index, probe.layers[index])
                want = [cm.vocab_relayout_time(model, probe, index, s) - base for s in t.strategies]
                assert list(got[:, 0]) == want and not got[:, 1:].any()
                checked += len(want)
    assert checked > 1000


def test_lexsort_orders_many_points_as_np_lexsort():
    """pareto.lexsort's integer code gives np.lexsort's order (ties in index order) on keys with
    repeated values, infinities, NaN, -0.0 and small integer levels, above its size threshold."""
    rng = np.random.default_rng(3)
    n = 2 * pareto.LEXSORT_CODE_ABOVE
    level = rng.integers(0, 40, n)
    mem = rng.integers(0, 50, n).astype(float)
    mem[rng.random(n) < 0.05] = np.inf
    cost = rng.integers(-20, 20, n).astype(float)
    cost[rng.random(n) < 0.05] = np.nan
    cost[cost == 0] = -0.0
    for keys in ((cost, mem, level), (level, cost, mem), (rng.random(n), level)):
        assert np.array_equal(pareto.lexsort(keys), np.lexsort(keys))
