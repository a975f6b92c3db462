"""The galvatron cost model against what Galvatron's own search engine printed (engine_results.json,
recorded by tools/galvatron_engine.py): time and per-stage memory within 0.5% for every plan."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

import cost_models
from cost_models.galvatron import (
    MB,
    GalvatronModel,
    allocator_reserve_mb,
    gplan_from_config,
)
from planners import Budget
from specs import SequenceParallel, SpecError, load_cluster, load_galvatron_plan
from specs.datasets import Dataset, data_path

RTOL = 0.005
FOLDER = data_path(Dataset.GALVATRON_LLAMA2_7B)


@pytest.fixture(scope="module")
def cm() -> GalvatronModel:
    return cost_models.get("galvatron", load_cluster("dgx-a100-80g"))


def _engine_plans():
    runs = json.loads((FOLDER / "engine_results.json").read_text())["runs"]
    seen, out = set(), []
    for run in runs:
        for task in run["tasks"]:
            key = (run["memory_gb"], json.dumps(task["config"], sort_keys=True), json.dumps(task["context"]))
            if key not in seen:
                seen.add(key)
                out.append((run["memory_gb"], task))
    return out


def test_enough_distinct_plans_recorded():
    plans = {json.dumps(t["config"], sort_keys=True) for _, t in _engine_plans()}
    assert len(plans) >= 10


def test_every_engine_plan_scores_as_the_engine_printed(cm):
    worst_t = worst_m = 0.0
    for memory_gb, task in _engine_plans():
        plan = gplan_from_config(task["config"], 8, task["context"])
        score = cm.score(plan, memory_gb * 1024 * MB)
        worst_t = max(worst_t, abs(score.time_s / task["time_s"] - 1))
        for ours, theirs in zip(score.stage_memory_mb, task["stage_memory_mb"], strict=True):
            worst_m = max(worst_m, abs(ours / theirs - 1))
    assert worst_t <= RTOL and worst_m <= RTOL, (worst_t, worst_m)


def test_chosen_plans_fit_their_budget(cm):
    runs = json.loads((FOLDER / "engine_results.json").read_text())["runs"]
    for run in runs:
        if run["chosen"] is None:
            continue
        plan = gplan_from_config(run["chosen"]["config"], 8, run["chosen"]["context"])
        assert max(cm.score(plan, run["memory_gb"] * 1024 * MB).stage_memory_mb) <= run["memory_gb"] * 1024


def test_allocator_reserve_is_galvatrons_rule():
    assert allocator_reserve_mb(16 * 1024) == 0
    assert allocator_reserve_mb(20 * 1024 + 1023) == 0  # 20 GB and a bit: max_mem // 1024 == 20
    assert allocator_reserve_mb(24 * 1024) == int(24 * 1024 * 0.2)


def test_plan_cost_matches_score_and_budget_term(cm):
    """plan_cost reports the memory without the reserve; the reserve is a budget term."""
    plan = load_galvatron_plan(next(FOLDER.glob("galvatron_config_*36GB*.json")), 8)
    budget = Budget(memory_gib=36).memory_bytes
    score, cost = cm.score(plan, budget), cm.plan_cost(cm.model_spec, plan)
    assert cost.iteration_time_s == pytest.approx(score.time_s)
    assert cost.peak_memory_bytes == pytest.approx(max(score.used_mb) * MB)
    assert cm.allocator_reserve_bytes(budget) == score.reserve_mb * MB
    assert cost_models.get("galvatron", cm.cluster, allocator_reserve=False).allocator_reserve_bytes(budget) == 0


def test_the_plan_s_vocabulary_choices_are_scored(cm):
    """vocab_zero3 is Galvatron's embed_sdp and vocab_sp ulysses its vsp: a plan saying so costs
    what the model with both switches on charges the same plan without them (they are not
    dropped); a Megatron-SP vocabulary is refused, and takes infinite memory in vocab_cost."""
    plan = load_galvatron_plan(next(FOLDER.glob("galvatron_config_*36GB*.json")), 8)
    assert plan.vocab_zero3 and plan.vocab_sp == SequenceParallel.ULYSSES
    plain = replace(plan, vocab_zero3=False, vocab_sp=SequenceParallel.NONE)
    switched = cost_models.get("galvatron", cm.cluster, vocab_sp=True, embed_sdp=True)
    said, forced, neither = (m.plan_cost(cm.model_spec, p) for m, p in ((cm, plan), (switched, plain), (cm, plain)))
    assert said.iteration_time_s == forced.iteration_time_s
    assert said.peak_memory_bytes == forced.peak_memory_bytes
    assert (said.iteration_time_s, said.peak_memory_bytes) != (neither.iteration_time_s, neither.peak_memory_bytes)
    megatron = replace(plain, vocab_sp=SequenceParallel.MEGATRON)
    with pytest.raises(SpecError, match="vocab_sp"):
        cm.plan_cost(cm.model_spec, megatron)
    assert cm.vocab_cost(cm.model_spec, megatron, 0, 8)[1].total_bytes == float("inf")


def test_gradient_buffers_stay_unsharded_with_chunks(cm):
    """With chunks > 1 Galvatron keeps more of the ZeRO-3 states per GPU (async grad reduce)."""
    raw = {"pp_deg": 1, "tp_sizes_enc": "1", "dp_types_enc": "1", "checkpoint": "1", "global_bsz": 64,
           "pipeline_type": "pipedream_flush", "default_dp_type": "zero2", "vtp": 1}
    states = {}
    for chunks in (1, 8):
        p = gplan_from_config({**raw, "chunks": chunks}, 8)
        kept = 32.0 * 64 / 8 / chunks  # the checkpointed input of the one micro-batch in flight
        states[chunks] = cm.engine.layer_memory_mb(p, p.layers[0], 0) - kept
    assert states[1] == pytest.approx(4 * 778.2236328125 * (1 / 8 + 0.003))
    assert states[8] > 1.5 * states[1]
