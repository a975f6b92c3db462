"""Properties over random small plans: the shortcut equals the full run; memory is returned."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cost_models
from simulator import simulate
from specs import load_cluster, load_model, uniform_plan

MODEL = load_model("tiny-gpt").scaled(hidden_size=256, num_layers=4, seq_len=128)
CLUSTERS = {name: load_cluster(name) for name in ("titan-8", "dgx-a100-80g")}
COST = {name: cost_models.get("analytical", c, calibration={}) for name, c in CLUSTERS.items()}


@st.composite
def plans(draw):
    pp = draw(st.sampled_from([1, 2, 4]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if t * pp <= 8]))
    dp = 8 // (tp * pp)
    m = draw(st.sampled_from([m for m in (1, 2, 4) if m >= pp] or [pp]))
    dp_type = draw(st.sampled_from(["ddp", "zero1", "zero2", "zero3"])) if dp > 1 else "ddp"
    return uniform_plan(MODEL.num_layers, tp=tp, dp=dp, pp=pp, global_batch=dp * m * 2, micro_batches=m,
                        dp_type=dp_type, recompute=draw(st.sampled_from(["none", "full"])),
                        schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
                        tp_consecutive=draw(st.booleans()))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(), cluster=st.sampled_from(sorted(CLUSTERS)))
def test_shortcut_equals_full_and_memory_is_freed(plan, cluster):
    cl, cm = CLUSTERS[cluster], COST[cluster]
    short = simulate(MODEL, cl, plan, cm)
    full = simulate(MODEL, cl, plan, cm, full=True)
    assert short.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    assert short.peak_memory_bytes == pytest.approx(full.peak_memory_bytes, rel=1e-9)
    assert 0.0 <= short.bubble_fraction < 1.0 and 0.0 < short.compute_busy_fraction <= 1.0
    # at the end only states and runtime overhead are live (every stash, gathered layer and
    # buffer was freed): the last level is the lowest of the iteration
    assert len(short.memory_timeline) == cl.world_size
    for timeline in short.memory_timeline:
        assert timeline[-1][1] == pytest.approx(min(level for _, level in timeline))
        assert timeline[-1][1] > 0
