"""RankGrid: groups by axis name, worked out by hand on 8 ranks (consecutive and strided tp,
Ulysses, gradient sync over combined axes, the expert view over the same ranks)."""
import pickle

import pytest

from specs import Degrees, LayerStrategy, SpecError, layer_grid, stage_grid


def grid(first: int = 0, **strategy):
    return layer_grid(first, LayerStrategy(**strategy).degrees)


def test_tp_consecutive_and_strided():
    g = grid(8, tp=2, dp=4)
    assert g.groups("tp") == ((8, 9), (10, 11), (12, 13), (14, 15))
    assert g.groups("dp") == ((8, 10, 12, 14), (9, 11, 13, 15))
    g = grid(0, tp=2, dp=4, tp_consecutive=False)
    assert g.groups("dp") == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert g.groups("tp") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert stage_grid(0, 8, 2, False) == g  # the same grid, built from degrees alone


def test_ulysses_has_its_own_axis_and_syncs_gradients_over_ulysses_and_dp():
    g = grid(0, ulysses=4, dp=2, sp="ulysses")
    assert g.groups("ulysses") == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert g.groups("tp") == tuple((r,) for r in range(8))  # weights whole: tp groups of one
    assert g.groups(("ulysses", "dp")) == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert g.groups(("cp", "ulysses", "dp")) == g.groups(("ulysses", "dp"))  # cp is 1
    strided = grid(0, ulysses=2, dp=4, sp="ulysses", tp_consecutive=False)
    assert strided.groups("ulysses") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert strided.groups(("dp", "ulysses")) == ((0, 1, 2, 3, 4, 5, 6, 7),)


def test_expert_view_megatron_core_order_over_the_same_ranks():
    g = grid(8, tp=2, dp=4, ep=2)  # etp 2 (= tp), ep 2, expert dp 2 on ranks 8..15
    assert g.groups("etp") == ((8, 9), (10, 11), (12, 13), (14, 15))
    assert g.groups("ep") == ((8, 10), (9, 11), (12, 14), (13, 15))
    assert g.groups("edp") == ((8, 12), (9, 13), (10, 14), (11, 15))
    # whole experts (etp 1) under tp 2: Megatron-Core's expert order over the stage
    assert grid(0, tp=2, dp=4, ep=4, expert_tp=1).groups("ep") == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_expert_view_follows_a_strided_layer():
    # strided tp 2 over dp 4: tp index t sits at t * 4 + dp index, dp index = d * ep + e
    g = grid(8, tp=2, dp=4, ep=2, tp_consecutive=False)
    assert g.groups("etp") == ((8, 12), (9, 13), (10, 14), (11, 15))
    assert g.groups("ep") == ((8, 9), (12, 13), (10, 11), (14, 15))
    assert g.groups("edp") == ((8, 10), (12, 14), (9, 11), (13, 15))


@pytest.mark.parametrize("strategy", [dict(tp=2, dp=4, ep=2, tp_consecutive=False), dict(tp=2, dp=4, ep=2),
                                      dict(tp=2, dp=4, ep=8, expert_tp=1), dict(ulysses=2, dp=4, sp="ulysses")])
def test_rank_and_coords_invert(strategy):
    g = grid(0, **strategy)
    for view in (None, "ep"):
        for rank in range(8):
            assert g.rank(**g.coords(rank, view)) == rank
    for rank in range(8):
        assert rank in g.group_of("tp", rank) and rank in g.group_of("edp", rank)


def test_groups_tile_the_grid_for_every_axis():
    g = grid(0, tp=2, dp=4, ep=2)
    for names in ("tp", "dp", "ep", "etp", "edp", ("tp", "dp"), ("ep", "edp")):
        assert sorted(r for group in g.groups(names) for r in group) == list(range(8))


def test_unknown_or_mixed_axes_are_refused_by_name():
    g = grid(0, tp=2, dp=4)
    with pytest.raises(SpecError, match="no grid or view has axes pp"):
        g.groups("pp")
    with pytest.raises(SpecError, match="no grid or view has axes tp, ep"):
        g.groups(("tp", "ep"))


def test_groups_are_cached_and_hash_once():
    d = Degrees(tp=2, dp=4)
    assert layer_grid(0, d).groups("tp") is layer_grid(0, Degrees(tp=2, dp=4)).groups("tp")


def test_degrees_pickle_without_their_cached_hash():
    d = Degrees(tp=2, dp=4, dp_type="zero1")
    hash(d)
    back = pickle.loads(pickle.dumps(d))
    assert back == d and "_hash" not in back.__dict__ and hash(back) == hash(d)
