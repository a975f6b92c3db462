"""The allocator reserve: its default rule, the fixed and share forms, validation, the options
of cost_models.get and the compare command line."""
from __future__ import annotations

import pytest

import cost_models
from cost_models.reserve import DEFAULT_RESERVE, NO_RESERVE, AllocatorReserve
from runners import compare
from specs import SpecError, load_cluster
from specs.units import GIB

CLUSTER = load_cluster("dgx-a100-80g:1")


def test_default_is_a_fifth_of_budgets_above_20_gib():
    assert DEFAULT_RESERVE.bytes_of(80 * GIB) == pytest.approx(16 * GIB)
    assert DEFAULT_RESERVE.bytes_of(20.9 * GIB) == 0.0  # floor(20.9) = 20 is not above 20
    assert DEFAULT_RESERVE.bytes_of(21 * GIB) == pytest.approx(4.2 * GIB)
    assert NO_RESERVE.bytes_of(80 * GIB) == 0.0
    assert DEFAULT_RESERVE.describe() == "20% of budgets above 20 GiB"


def test_fixed_and_share_apply_to_every_budget():
    assert AllocatorReserve.fixed(4).bytes_of(8 * GIB) == 4 * GIB
    assert AllocatorReserve.share(0.1).bytes_of(8 * GIB) == pytest.approx(0.8 * GIB)
    assert AllocatorReserve(fraction=0.1, above_gib=0, gib=2).bytes_of(40 * GIB) == pytest.approx(6 * GIB)
    assert AllocatorReserve.fixed(4).describe() == "4 GiB"


@pytest.mark.parametrize("kwargs, field", [({"fraction": 1.0}, "reserve_fraction"), ({"gib": -1}, "reserve.gib"),
                                           ({"fraction": float("nan")}, "reserve.fraction"),
                                           ({"above_gib": True}, "reserve.above_gib")])
def test_bad_reserves_are_refused(kwargs, field):
    with pytest.raises(SpecError, match=field):
        AllocatorReserve(**kwargs)


def test_a_reserve_that_leaves_nothing_names_both_numbers():
    with pytest.raises(SpecError, match="a 90 GiB allocator reserve leaves nothing of a 80 GiB budget"):
        AllocatorReserve.fixed(90).bytes_of(80 * GIB)


def test_cost_model_options_set_the_reserve():
    assert cost_models.get("analytical", CLUSTER).allocator_reserve_bytes(80 * GIB) == pytest.approx(16 * GIB)
    assert cost_models.get("analytical", CLUSTER, reserve_gib=4).allocator_reserve_bytes(80 * GIB) == 4 * GIB
    share = cost_models.get("analytical", CLUSTER, reserve_fraction=0.05)
    assert share.allocator_reserve_bytes(80 * GIB) == pytest.approx(4 * GIB)
    assert cost_models.get("analytical", CLUSTER, allocator_reserve=False).allocator_reserve_bytes(80 * GIB) == 0
    galvatron = cost_models.get("galvatron", CLUSTER, reserve_gib=3)  # its own MB rule unless told otherwise
    assert galvatron.allocator_reserve_bytes(80 * GIB) == 3 * GIB
    with pytest.raises(SpecError, match="give one of reserve_fraction, reserve_gib"):
        cost_models.get("analytical", CLUSTER, reserve_gib=4, reserve_fraction=0.1)


def test_help_names_the_reserve_and_its_default(capsys):
    with pytest.raises(SystemExit):
        compare.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--reserve-gib" in text and "--reserve-fraction" in text
    assert "default 20% of budgets above 20 GiB" in text


def test_compare_reserve_frees_memory_and_says_so(capsys):
    args = ["--model", "llama3-8b", "--cluster", "dgx-h100:2", "--planners", "zero3", "--global-batch", "32",
            "--no-progress"]
    assert compare.main(args + ["--reserve-gib", "2"]) == 0
    assert "budget per GPU: 80 GiB (2 GiB allocator reserve); reserve: 2 GiB" in capsys.readouterr().out
    assert compare.main(args + ["--reserve-gib", "2", "--reserve-fraction", "0.1"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
