"""The adaptation of measured runs to what Megatron executed; the memory rows of the accuracy
benchmark; the calibrated model on Megatron-LM's published runs, which nothing is fitted to."""
import numpy as np
import pytest

from benchmarks.cost_model_accuracy import capacity_rows, galvatron_memory_rows
from cost_models.calibrate import predict
from cost_models.constants import AnalyticalConstants, constants_for
from cost_models.measured_runs import MEGATRON_SOFTWARE, _padded_vocab, as_megatron, load_cases, megatron_runs
from specs import load_cluster, load_model, model_from_dict, uniform_plan
from tests.cost_models.synthetic import synthetic_runs


def test_vocabulary_is_padded_to_128_times_tp_and_split():
    assert _padded_vocab(50257, 1) == 50304
    assert _padded_vocab(50257, 8) == 51200
    model = model_from_dict({"model_type": "gpt2", "n_embd": 1024, "n_head": 16, "n_layer": 4,
                             "n_positions": 1024, "vocab_size": 50257})
    plan = uniform_plan(model.num_layers, tp=4, dp=2, global_batch=16, micro_batches=2)
    m, p = as_megatron(model, plan)
    assert m.embedding.vocab_size == m.head.output_size == 50688 and p.vocab_tp == 4
    assert p.schedule == "1f1b"


def test_1f1b_with_fewer_micro_batches_than_stages_runs_as_gpipe():
    model = load_model("gpt-1.7b")
    plan = uniform_plan(model.num_layers, pp=4, global_batch=2, micro_batches=2, schedule="1f1b")
    assert as_megatron(model, plan)[1].schedule == "gpipe"


def test_layer_states_and_activations_match_galvatrons_measured_llama_layer():
    rows = galvatron_memory_rows()
    assert len(rows) >= 4
    for name, states, states_formula, act, act_formula in rows:
        assert states_formula == pytest.approx(states, rel=0.01), name
        if "ckpt" not in name:
            assert act_formula == pytest.approx(act, rel=0.07), name


def test_vtrain_sets_load_from_the_repository_data():
    single, multi = load_cases("single"), load_cases("multi")
    assert (len(single), len(multi)) == (1440, 109)  # the row counts data/vtrain_a100 documents
    for run in single[::97] + multi[::11]:
        s = run.plan.layers[0]
        assert s.tp * s.dp * run.plan.pp == run.cluster.world_size
        assert run.measured_s > 0 and run.model_key.startswith("h")


def test_published_megatron_runs_load_with_their_recompute_sp_and_interleaving():
    runs = load_cases("published")
    assert len(runs) == 8  # four models, each with full recomputation and with SP + selective
    modes = {(r.plan.layers[0].recompute, r.plan.layers[0].sp) for r in runs}
    assert modes == {("full", "none"), ("selective", "megatron")}
    assert {r.model_key: r.plan.virtual_stages for r in runs} == {
        "h6144-L48": 1, "h12288-L96": 3, "h20480-L105": 3, "h25600-L128": 1}
    for run in runs:
        s = run.plan.layers[0]
        assert s.tp * s.dp * run.plan.pp == run.cluster.world_size
        if run.cluster.nodes > 1:  # dgx-a100-80g's 8 NICs, not the vTrain multi-node set's 4
            assert run.cluster.inter_node.nics_per_node == 8
    assert load_cases("multi")[0].cluster.inter_node.nics_per_node == 4


def test_single_node_calibration_predicts_megatrons_published_runs():
    """a100.json is fitted on vTrain's single-node Megatron-DeepSpeed runs only; Megatron-LM's
    published 22B-1T runs test what that fit never saw: tp 8 with sequence parallelism,
    selective recomputation, interleaved 1F1B and up to 64 pipeline stages."""
    runs = megatron_runs("published")
    constants = constants_for(load_cluster("dgx-a100-80g").calibration).with_values(MEGATRON_SOFTWARE)
    predicted = predict(constants, runs)
    measured = np.array([r.measured_s for r in runs])
    error = predicted / measured - 1
    assert np.abs(error).max() < 0.05 and np.abs(error).mean() < 0.03  # without interleaving: 5.9% and 3.1%
    # what SP + selective recomputation buys over full recomputation, per model (measured 1.29-1.32x)
    by_mode = {(r.model_key, r.plan.layers[0].recompute): (p, r.measured_s) for r, p in zip(runs, predicted)}
    for key in {r.model_key for r in runs}:
        (full_p, full_m), (sel_p, sel_m) = by_mode[key, "full"], by_mode[key, "selective"]
        assert full_p / sel_p == pytest.approx(full_m / sel_m, rel=0.05), key


def test_capacity_check_tells_apart_sets_made_with_different_constants():
    """The multi-node stand-in costs 0.2 s more per iteration than the single-node one: a fit on
    it alone finds that (and then misses the other set); a fit on both cannot fit either."""
    base = AnalyticalConstants(iteration_overhead_s=1e-3)
    single, multi = synthetic_runs(base), synthetic_runs(base.with_values({"iteration_overhead_s": 0.2}))
    rows = {row[0]: row for row in capacity_rows({"single": single, "multi": multi, "published": single},
                                                 start=base, max_evals=40)}
    _, single_mape, _, multi_mape, _, published_mape, _, overhead_s, _ = rows["multi"]
    assert multi_mape < 1.0 < single_mape and published_mape == single_mape
    assert overhead_s == pytest.approx(0.2, rel=0.05)
    both = rows["single + multi"]
    assert both[1] > 1.0 and both[3] > 1.0
