"""The count MILP (planners/count_formulation.py): on identical layers whose relayouts obey the
triangle inequality it is used, and the ILP and CP-SAT find with it the optimum the per-layer
model finds; elsewhere the per-layer model stands."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import planners
from planners import count_formulation, count_index
from planners.formulation import read_plan
from planners.outer import grouped_tables
from tests.planners.random_instances import KIB, SMALL_SPACE, RandomCostModel, instance, tiny_cluster, tiny_model

SPACE = replace(SMALL_SPACE, max_pp=4, micro_batches=(2, 4))


class MetricRelayouts(RandomCostModel):
    """Random everything, but a relayout costs the L1 distance between points drawn per layout
    (whole ticks), so the class-to-class times obey the triangle inequality."""

    def transition_time(self, layer, prev, nxt, micro_batch_size, first_rank=0):
        a, b = self._point(prev, first_rank), self._point(nxt, first_rank)
        return float(np.abs(a - b).sum()) * 1e-7

    def _point(self, s, first_rank):
        return self._rng("x", s.tp, s.dp, s.tp_consecutive, first_rank).integers(0, 4000, size=2)


def _identical_instance(seed: int, metric: bool = True):
    rng = np.random.default_rng(1000 + seed)
    model = tiny_model(int(rng.integers(3, 9)), identical=True)
    cluster = tiny_cluster()
    cm = (MetricRelayouts if metric else RandomCostModel)(cluster, seed)
    kib = int(rng.integers(2000, 20000))
    return model, cluster, cm, planners.Budget(memory_gib=kib * KIB / 1024**3, global_batch=8)


def _runs_instance(seed: int, metric: bool = True):
    """Two or three runs (1-4 layers each) of layers that differ by seq_len, as T5's encoder and
    decoder or Swin's stages do."""
    rng = np.random.default_rng(2000 + seed)
    lengths = rng.integers(1, 5, size=int(rng.integers(2, 4)))
    layers = tuple(replace(tiny_model(1, identical=True).layers[0], seq_len=16 + 8 * j)
                   for j, length in enumerate(lengths) for _ in range(length))
    model = replace(tiny_model(1), name=f"runs-{len(layers)}", layers=layers)
    cluster = tiny_cluster()
    cm = (MetricRelayouts if metric else RandomCostModel)(cluster, seed)
    kib = int(rng.integers(2000, 20000))
    return model, cluster, cm, planners.Budget(memory_gib=kib * KIB / 1024**3, global_batch=8)


def _check_counts_find_the_per_layer_optimum(name, model, cluster, cm, budget):
    groups = grouped_tables(model, cm, budget.memory_bytes, SPACE, budget.global_batches())
    assert all(count_formulation.applies(t) for t in groups)
    plan = {form: planners.get(name).plan(model, cluster, budget, cm,
                                          {"space": SPACE, "warm_start": False, "formulation": form})
            for form in ("layers", "counts")}
    assert plan["counts"].feasible == plan["layers"].feasible
    if not plan["counts"].feasible:
        return
    assert plan["counts"].iteration_time_s == pytest.approx(plan["layers"].iteration_time_s, rel=1e-9)
    r = plan["counts"]
    assert r.stats.solver_status == "optimal"
    r.plan.validate(model, cluster)
    cost = cm.plan_cost(model, r.plan)
    assert cost.iteration_time_s == r.iteration_time_s  # the plan read back is the one solved
    assert cost.peak_memory_bytes <= budget.memory_bytes
    _within_highs_tolerance(r)


def _within_highs_tolerance(r):
    """The solver's objective is plan_cost's time, but for HiGHS only to its MIP feasibility
    tolerance (1e-6, here seconds): one instance over runs (ilp-2-metric) ends with Dmax 1e-6 s
    below D_0."""
    if "mismatch" in r.message:
        rel = float(r.message.split("mismatch ")[1].split()[0])
        assert rel * r.iteration_time_s <= 1.05e-6, r.message


@pytest.mark.parametrize("metric", [True, False], ids=["metric", "shortcuts"])
@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("name", ["ilp", "cpsat"])
def test_counts_find_the_per_layer_optimum_over_runs(name, seed, metric):
    """Several layer types in runs: the stage boundaries move between and within runs."""
    _check_counts_find_the_per_layer_optimum(name, *_runs_instance(seed, metric))


@pytest.mark.parametrize("metric", [True, False], ids=["metric", "shortcuts"])
@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("name", ["ilp", "cpsat"])
def test_counts_find_the_per_layer_optimum(name, seed, metric):
    """metric: relayouts obey the triangle inequality; shortcuts: random relayouts, where a
    chain through another layout can be cheaper than the direct one."""
    _check_counts_find_the_per_layer_optimum(name, *_identical_instance(seed, metric))


def test_warm_start_values_read_back_as_the_same_plan():
    model, cluster, cm, budget = _identical_instance(3)
    groups = grouped_tables(model, cm, budget.memory_bytes, SPACE, budget.global_batches())
    t = max(groups, key=lambda t: (t.combo.pp == 2, t.allowed[0].sum()))
    f = count_formulation.build(t, next(iter(t.vocab)))
    allowed = np.flatnonzero(t.allowed[0])
    classes = count_formulation.run_classes(t, 0, 0)[0]
    a, b = 0, int(np.flatnonzero(classes != classes[0])[0])
    pp, n = t.combo.pp, model.num_layers
    assert pp == 2 and n >= 4
    sizes = [n - 1, 1]
    choice = [int(allowed[a])] * n
    choice[1] = int(allowed[b])  # stage 0 runs class A, B, A: three runs
    values = f.counts.warm_values(choice, sizes)
    assert values
    got, got_sizes = read_plan(values, f, n, pp)
    assert got_sizes == sizes
    assert sorted(got) == sorted(choice)
    assert got[0] == choice[0]
    ends = np.cumsum(sizes) - 1
    assert [got[i] for i in ends] == [choice[i] for i in ends]


def test_warm_start_values_read_back_over_runs():
    """A plan whose stage boundary cuts a run: its warm values read back as the same blocks,
    with each block's first and last layers where the plan has them."""
    rng = np.random.default_rng(0)
    for seed in range(16):
        model, cluster, cm, budget = _runs_instance(seed)
        runs = [(r.start, r.stop) for r in count_index.layer_runs(np.array([l.seq_len for l in model.layers]))]
        if runs[0][1] - runs[0][0] >= 2 and model.num_layers >= 4:
            break
    t = next(t for t in grouped_tables(model, cm, budget.memory_bytes, SPACE, budget.global_batches())
             if t.combo.pp == 2)
    f = count_formulation.build(t, next(iter(t.vocab)))
    n, sizes = model.num_layers, [runs[0][1] - 1, model.num_layers - runs[0][1] + 1]  # run 0 on both stages
    for _ in range(100):
        choice = [int(rng.choice(np.flatnonzero(t.allowed[ty]))) for ty in t.layer_type]
        values = f.counts.warm_values(choice, sizes)
        if values:
            break
    assert values
    got, got_sizes = read_plan(values, f, n, 2)
    assert got_sizes == sizes
    cuts = sorted({0, n, sizes[0]} | {a for a, _ in runs})  # block boundaries
    for a, b in zip(cuts, cuts[1:]):
        assert sorted(got[a:b]) == sorted(choice[a:b])
        assert (got[a], got[b - 1]) == (choice[a], choice[b - 1])


def test_applies_where_layers_differ():
    model, cluster, cm, budget = instance(1)  # every layer a type of its own: one run each
    assert len(set(model.layers)) > 1
    t = grouped_tables(model, cm, budget.memory_bytes, SMALL_SPACE, budget.global_batches())[0]
    assert count_formulation.applies(t)
    model, cluster, cm, budget = _runs_instance(0)
    t = grouped_tables(model, cm, budget.memory_bytes, SPACE, budget.global_batches())[0]
    assert count_formulation.applies(t) and len(count_index.layer_runs(t.layer_type)) > 1


def test_relayouts_are_charged_their_cheapest_chain():
    R = np.array([[0.0, 1.0, 5.0], [1.0, 0.0, 1.0], [7.0, 1.0, 0.0]])
    assert count_formulation.shortest_paths(R).tolist() == [[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]


def test_auto_takes_counts_only_where_they_pay():
    model, cluster, cm, budget = _identical_instance(0)
    small = grouped_tables(model, cm, budget.memory_bytes, SPACE, budget.global_batches())
    assert not any(count_formulation.pays(t, even=False) for t in small)  # 3-8 layers: slots ~ layers
    deep = grouped_tables(replace(model, layers=model.layers * 12), cm, budget.memory_bytes, SPACE,
                          budget.global_batches())
    assert all(count_formulation.pays(t, even=False) for t in deep if t.combo.pp == 1)


def test_slots_per_stage_are_the_classes_plus_one():
    model, cluster, cm, budget = _identical_instance(0)
    t = grouped_tables(replace(model, layers=model.layers * 4), cm, budget.memory_bytes, SPACE,
                       budget.global_batches())[0]
    f = count_formulation.build(t, next(iter(t.vocab)))
    classes = count_formulation.run_classes(t, 0, 0)[0]
    assert f.counts.slots[(0, 0)] == min(int(classes.max()) + 2, len(t.layer_type) - (t.combo.pp - 1))
    assert not f.w_index  # no per-layer binaries


def test_a_plan_through_a_shortcut_is_solved_again_per_layer(monkeypatch):
    """Where the count model's plan takes a relayout its chain undercuts, its objective is only a
    bound: the group is solved again with one binary per layer, and the result is that optimum."""
    for seed in range(16):  # the first instance with a plan
        model, cluster, cm, budget = _identical_instance(seed, metric=False)
        expected = planners.get("ilp").plan(model, cluster, budget, cm,
                                            {"space": SPACE, "warm_start": False, "formulation": "layers"})
        if expected.feasible:
            break
    seen = []
    monkeypatch.setattr(count_index.CountIndex, "takes_a_shortcut", lambda self, *a: seen.append(a) or True)
    built = []
    from planners import exact
    real_build = exact.build
    monkeypatch.setattr(exact, "build", lambda *a, **k: built.append(a) or real_build(*a, **k))
    got = planners.get("ilp").plan(model, cluster, budget, cm,
                                   {"space": SPACE, "warm_start": False, "formulation": "counts"})
    assert seen and len(built) == len(seen)  # every count solution was solved again per layer
    assert got.feasible and got.stats.solver_status == "optimal"
    assert got.iteration_time_s == pytest.approx(expected.iteration_time_s, rel=1e-9)


def test_takes_a_shortcut_reads_the_plan_s_relayouts():
    R = np.array([[0.0, 1.0, 5.0], [1.0, 0.0, 1.0], [5.0, 1.0, 0.0]])
    index = count_index.CountIndex(runs=[count_index.Run(type=0, start=0, length=4)],
                                         strategies={0: np.array([10, 11, 12])},
                                         classes={(k, 0): np.array([0, 1, 2]) for k in range(2)},
                                         slots={(k, 0): 4 for k in range(2)}, relayout_s={(k, 0): R for k in range(2)},
                                         chained_s={(k, 0): count_formulation.shortest_paths(R) for k in range(2)})
    assert index.takes_a_shortcut([10, 10, 12, 12], [4, 0])  # 0 -> 2 direct: 5 > 2 through 1
    assert not index.takes_a_shortcut([10, 11, 12, 12], [4, 0])
    assert not index.takes_a_shortcut([10, 10, 12, 12], [2, 2])  # the change falls between stages


@pytest.mark.parametrize("seed", range(6))
def test_counts_with_even_stages_and_the_dp_warm_start(seed):
    model, cluster, cm, budget = _identical_instance(seed, metric=seed % 2 == 0)
    opts = {"space": SPACE, "partition": "even", "warm_start": True}
    got = {form: planners.get("cpsat").plan(model, cluster, budget, cm, {**opts, "formulation": form})
           for form in ("layers", "counts")}
    assert got["counts"].feasible == got["layers"].feasible
    if got["counts"].feasible:
        assert got["counts"].iteration_time_s == pytest.approx(got["layers"].iteration_time_s, rel=1e-9)


def test_an_unknown_formulation_is_refused_in_one_line():
    from specs import SpecError
    model, cluster, cm, budget = _identical_instance(0)
    with pytest.raises(SpecError, match=r"formulation.*auto, counts, layers.*'rows'"):
        planners.get("cpsat").plan(model, cluster, budget, cm, {"space": SPACE, "formulation": "rows"})
