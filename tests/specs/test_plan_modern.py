"""Plan: sequence parallelism, selective recompute, interleaving, vocabulary strategy (issue 15)."""
import json

import pytest

from specs import (LayerStrategy, Plan, SpecError, load_cluster, load_model, model_from_dict, padded_vocab,
                   plan_from_galvatron, plan_to_galvatron, uniform_plan)

TITAN = load_cluster("titan-8")
GPT12 = model_from_dict({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 30,
                         "n_positions": 1024, "vocab_size": 50257})


def test_new_fields_round_trip_through_json():
    plan = uniform_plan(30, tp=2, dp=2, pp=2, global_batch=16, micro_batches=4, recompute="selective",
                        sp="megatron", vocab_tp=4, vocab_zero3=True, vocab_sp="ulysses", schedule="interleaved_1f1b",
                        virtual_stages=3)
    back = Plan.from_dict(json.loads(plan.to_json()))
    assert back == plan
    assert back.layers[0].recompute == "selective" and back.layers[0].sp == "megatron"
    assert (back.vocab_tp, back.vocab_zero3, back.vocab_sp, back.virtual_stages) == (4, True, "ulysses", 3)


def test_old_boolean_files_still_load():
    old = {"pp": 1, "stage_layers": [2], "global_batch": 8, "micro_batches": 1, "version": 1,
           "layers": [{"tp": 2, "dp": 4, "checkpoint": True, "sp": True}, {"tp": 1, "dp": 8, "checkpoint": False}]}
    plan = Plan.from_dict(old)
    assert [s.recompute for s in plan.layers] == ["full", "none"]
    assert [s.sp for s in plan.layers] == ["megatron", "none"]
    assert plan.layers[0].checkpoint and not plan.layers[1].checkpoint


def test_contradicting_old_and_new_recompute_is_refused():
    raw = {"pp": 1, "stage_layers": [1], "global_batch": 8, "micro_batches": 1,
           "layers": [{"checkpoint": True, "recompute": "selective"}]}
    with pytest.raises(SpecError, match="checkpoint True contradicts recompute 'selective'"):
        Plan.from_dict(raw)


def test_bad_enum_values_name_the_field():
    with pytest.raises(SpecError, match="recompute: must be one of none, selective, full, selective-op; got 'some'"):
        LayerStrategy(recompute="some")
    with pytest.raises(SpecError, match="sp: must be one of none, megatron, ulysses; got 'ring'"):
        LayerStrategy(sp="ring")


@pytest.mark.parametrize("kw, message", [
    (dict(ulysses=8, dp=1, sp="ulysses", global_batch=8), "layer 0: ulysses degree 8 does not divide heads 12"),
    (dict(tp=1, dp=8, sp="megatron", global_batch=8), r"layer 0: sp megatron needs tp > 1 \(tp is 1\)"),
    (dict(tp=4, dp=1, pp=2, schedule="interleaved_1f1b", virtual_stages=2, global_batch=8, micro_batches=4),
     None),  # valid: 30 layers on pp 2 * v 2 chunks of 7, 8, 8, 7 (embedding and loss count as layers)
])
def test_sequence_parallel_rules(kw, message):
    plan = uniform_plan(30, **kw)
    if message is None:
        plan.validate(GPT12, TITAN)
        assert plan.layers_per_chunk() == (7, 8, 8, 7)
        return
    with pytest.raises(SpecError, match=message):
        plan.validate(GPT12, TITAN)


def test_interleaving_rules_print_the_numbers():
    model = load_model("bert-huge-32")
    # 5 layers over 8 chunks: even with the embedding and the loss in chunks of their own, one is left empty
    with pytest.raises(SpecError, match=r"virtual_stages: 5 layers leave a chunk empty on pp\(4\) \* "
                                        r"virtual_stages\(2\) = 8 chunks"):
        uniform_plan(5, dp=2, pp=4, global_batch=8, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=2)
    with pytest.raises(SpecError, match="interleaved 1F1B needs micro-batches a multiple of pp: micro_batches 6, pp 4"):
        uniform_plan(32, dp=2, pp=4, global_batch=12, micro_batches=6, schedule="interleaved_1f1b",
                     virtual_stages=2).validate(model, TITAN)
    with pytest.raises(SpecError, match=r"virtual_stages 2 needs schedule interleaved_1f1b \(gpipe runs one model "
                                        r"chunk per rank\)"):
        uniform_plan(32, dp=2, pp=4, global_batch=8, micro_batches=4, virtual_stages=2,
                     schedule="gpipe").validate(model, TITAN)
    uniform_plan(32, dp=2, pp=4, global_batch=16, micro_batches=8, schedule="interleaved_1f1b",
                 virtual_stages=2).validate(model, TITAN)


def test_interleaved_stages_hold_round_robin_chunks():
    plan = uniform_plan(8, dp=4, pp=2, global_batch=8, micro_batches=2, schedule="interleaved_1f1b", virtual_stages=2)
    assert [list(r) for r in plan.chunk_ranges()] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [list(r) for r in plan.stage_ranges()] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert plan.chunk_starts() == {0, 2, 4, 6}


def test_vocabulary_is_padded_so_any_stage_divisor_shards_it():
    assert padded_vocab(50257, 1) == 50304 and padded_vocab(50257, 8) == 51200
    assert padded_vocab(32000, 8) == 32768 and padded_vocab(1024, 8) == 1024
    plan = uniform_plan(30, tp=1, dp=8, global_batch=8, vocab_tp=8)
    plan.validate(GPT12, TITAN)  # 50257 is prime to 8: sharded after padding
    assert plan.padded_vocab_size(50257) == 51200
    with pytest.raises(SpecError, match=r"vocab_tp\(3\) must divide the 8 GPUs per stage"):
        uniform_plan(30, tp=1, dp=8, global_batch=8, vocab_tp=3).validate(GPT12, TITAN)
    with pytest.raises(SpecError, match=r"vocab_sp megatron needs vocab_tp > 1 \(vocab_tp is 1\)"):
        uniform_plan(30, tp=1, dp=8, global_batch=8, vocab_sp="megatron").validate(GPT12, TITAN)
    with pytest.raises(SpecError, match="vocab_zero3 needs data-parallel replicas: 8 GPUs per stage / vocab_tp 8 = 1"):
        uniform_plan(30, tp=1, dp=8, global_batch=8, vocab_tp=8, vocab_zero3=True).validate(GPT12, TITAN)


def test_ulysses_can_shard_states_over_its_whole_group():
    s = LayerStrategy(ulysses=8, dp=1, sp="ulysses", dp_type="zero3")
    assert (s.tp, s.degrees.grad_sync) == (1, 8)
    uniform_plan(32, ulysses=8, dp=1, sp="ulysses", dp_type="zero3", global_batch=8).validate(
        load_model("llama2-7b"), load_cluster("dgx-a100-80g"))


def test_galvatron_sp_fields_import_and_export():
    raw = {"pp_deg": 1, "tp_sizes_enc": "1,2", "sp_sizes_enc": "4,1", "use_sp": "1,0", "dp_types_enc": "1,0",
           "checkpoint": "0,1", "global_bsz": 8, "chunks": 1, "vtp": 2, "vsp": 1, "embed_sdp": 1,
           "default_dp_type": "zero2"}
    plan = plan_from_galvatron(raw, world_size=8)
    a, b = plan.layers
    assert (a.tp, a.ulysses, a.dp, a.sp, a.dp_type, a.recompute) == (1, 4, 2, "ulysses", "zero3", "none")
    assert (b.tp, b.dp, b.sp, b.dp_type, b.recompute) == (2, 4, "none", "zero2", "full")
    assert (plan.vocab_tp, plan.vocab_sp, plan.vocab_zero3) == (2, "ulysses", True)
    out = plan_to_galvatron(plan)
    assert (out["tp_sizes_enc"], out["sp_sizes_enc"], out["use_sp"]) == ("1,2", "4,1", "1,0")
    assert (out["vtp"], out["vsp"], out["embed_sdp"]) == (2, 1, 1)
    assert plan_from_galvatron(out, world_size=8) == plan


@pytest.mark.parametrize("raw, message", [
    ({"tp_sizes_enc": "2", "sp_sizes_enc": "2", "use_sp": "1"}, "sp_sizes_enc: layer 0: tp 2 combined with ulysses 2"),
    ({"tp_sizes_enc": "1", "cp_sizes_enc": "3"}, r"cp_sizes_enc: layer 0: tp\(1\) \* cp\(3\) does not divide 8"),
    ({"tp_sizes_enc": "1", "vcp": 2}, "vcp: vocabulary cp 2 has no field in hybridpar plans"),
    ({"tp_sizes_enc": "1", "use_sp": "2"}, "use_sp: entries must be 0 or 1, got 2"),
    ({"tp_sizes_enc": "1", "vsp": 3}, "vsp: .* 1, got 3"),
])
def test_galvatron_import_refuses_what_has_no_meaning(raw, message):
    with pytest.raises(SpecError, match=message):
        plan_from_galvatron({"pp_deg": 1, "global_bsz": 8, **raw}, world_size=8)


@pytest.mark.parametrize("kw, message", [
    (dict(sp="megatron", tp=2, dp=4), "layer 0: sp megatron has no field in Galvatron files"),
    (dict(recompute="selective", dp=8), "layer 0: recompute selective has no field"),
    (dict(dp=4, pp=2, micro_batches=2, schedule="interleaved_1f1b", virtual_stages=2),
     r"interleaved_1f1b \(virtual_stages 2\) has no field"),
])
def test_galvatron_export_refuses_what_it_cannot_say(kw, message):
    with pytest.raises(SpecError, match=message):
        plan_to_galvatron(uniform_plan(4, global_batch=8, **kw))
