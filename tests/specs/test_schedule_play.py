"""Schedules played op by op (specs.schedule_play) on cases worked out by hand, against the closed
forms where they are exact, and the steady-state extrapolation against a whole play."""
import random

import pytest

from specs import SpecError
from specs.schedule_play import StageWork, _play, played_s, steady_micro_batches
from specs.schedules import schedule_entry

UNIT = StageWork(1.0, 1.0, 1.0)
"""F = B = W = 1 s per stage and micro-batch."""


def test_zb_h1_on_2_stages_and_4_micro_batches():
    """By hand, F = B = W = 1: s0 F0 0-1, F1 1-2; s1 F0 1-2, B0 2-3; s0 B0 3-4, W0 4-5; s1 F1 3-4,
    B1 4-5, W0 5-6; s0 F2 5-6, B1 6-7, W1 7-8; s1 F2 6-7, B2 7-8, W1 8-9; s0 F3 8-9, B2 9-10,
    W2 10-11; s1 F3 9-10, B3 10-11, W2 11-12, W3 12-13; s0 B3 11-12, W3 12-13. 13 s = m (F + B
    + W) + (pp - 1)(F + B - W): 1F1B would take 12 + 3."""
    assert played_s(schedule_entry("zb_h1"), [UNIT, UNIT], 4, 1) == pytest.approx(13.0)
    assert played_s(schedule_entry("1f1b"), [UNIT, UNIT], 4, 1) == pytest.approx(15.0)


def test_zbv_on_2_stages_and_4_micro_batches():
    """Chunks of f = b = w = 1 (stage F = B = W = 2): the timeline test of the simulator
    (tests/simulator/test_timelines.py) plays it to 25 s = m T + (pp - 1)(f + b - w)."""
    two = StageWork(2.0, 2.0, 2.0)
    assert played_s(schedule_entry("zbv"), [two, two], 4, 2) == pytest.approx(25.0)


@pytest.mark.parametrize("pp", [2, 4])
def test_zbv_with_one_micro_batch_pays_the_whole_pipeline(pp):
    """One micro-batch crosses all 2 pp chunks forward and back, one after the other, before the
    first chunk's W: at least 2 pp (f + b) + w, far above one stage's work (m T)."""
    played = played_s(schedule_entry("zbv"), [UNIT] * pp, 1, 2)
    assert played >= 2 * pp * (0.5 + 0.5) + 0.5
    assert played > 3.0 * 1.5


@pytest.mark.parametrize("schedule, v, m", [("1f1b", 1, 8), ("interleaved_1f1b", 2, 8), ("gpipe", 1, 5)])
def test_the_play_gives_the_closed_forms_on_even_stages(schedule, v, m):
    """Even stages: (m - 1 + (pp - 1) / v + 1) T for 1F1B and interleaving, GPipe as 1F1B."""
    entry, pp, T = schedule_entry(schedule), 4, 3.0
    formula = entry.formula(m, v)
    assert played_s(entry, [UNIT] * pp, m, v) == pytest.approx(formula.time_s(T, pp * T, 0.0))


@pytest.mark.parametrize("schedule, v", [("zb_h1", 1), ("zbv", 2), ("dualpipev", 2)])
@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_extrapolated_steady_state_matches_the_whole_play(schedule, v, pp):
    """Uneven stages: past steady_micro_batches each micro-batch adds the busiest stage's work;
    the whole play is at most 0.3% shorter (the other stages' slack), never longer."""
    rng, entry = random.Random(pp), schedule_entry(schedule)
    stages = [StageWork(rng.uniform(0.5, 1.5), rng.uniform(0.5, 2.0), rng.uniform(0.1, 1.2)) for _ in range(pp)]
    for m in (steady_micro_batches(pp) + 1, 3 * steady_micro_batches(pp) + pp):
        m -= m % (m // pp) if schedule == "zb_h1" else 0
        if entry.allows(pp, m, v):
            whole, extrapolated = _play(entry, stages, m, v), played_s(entry, stages, m, v)
            assert whole - 1e-9 <= extrapolated <= whole * 1.003


def test_the_play_never_beats_the_busiest_stage():
    """The planners' bound for split-backward schedules (no bubble) holds: m max_k T_k at least."""
    rng = random.Random(7)
    for schedule, v in (("zb_h1", 1), ("zbv", 2), ("dualpipev", 2)):
        entry = schedule_entry(schedule)
        for m in (4, 9, 16, 40):
            stages = [StageWork(rng.uniform(0.5, 1.5), rng.uniform(0.5, 2.0), rng.uniform(0.1, 1.2)) for _ in range(2)]
            if entry.allows(2, m, v):
                bound = entry.formula(m, v).time_s(max(s.total_s for s in stages), sum(s.total_s for s in stages), 0.0)
                assert played_s(entry, stages, m, v) >= bound - 1e-9


def test_bad_shares_are_refused_in_one_line():
    with pytest.raises(SpecError, match=r"^stage_work: shares forward 0.8 \+ weight 0.5 must lie in \[0, 1\]$"):
        StageWork.split(1.0, 0.8, 0.5)
    with pytest.raises(SpecError, match="weight_grad_s"):
        StageWork(1.0, 1.0, -1.0)
