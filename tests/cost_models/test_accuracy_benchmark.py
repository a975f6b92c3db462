"""The adaptation of vTrain runs to what Megatron executed; the memory rows of the accuracy benchmark."""
import pytest

from benchmarks.cost_model_accuracy import galvatron_memory_rows
from cost_models.measured_runs import _padded_vocab, as_megatron, load_cases
from specs import load_model, model_from_dict, uniform_plan


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
