"""Our profile format (reader/writer/validation) and the profiled model on ours and Galvatron's files."""
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

import cost_models
from specs.profile_format import Profile, ProfileError, load_profile, save_profile
from cost_models.profiled import ProfiledModel, from_galvatron_dir
from specs import LayerStrategy, SpecError, load_cluster, load_model, uniform_plan

REPO = Path(__file__).resolve().parents[2]


def _doc_example() -> dict:
    text = (REPO / "docs" / "profile_format.md").read_text()
    return json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))


def test_the_documented_example_round_trips(tmp_path):
    profile = Profile.from_dict(_doc_example())
    save_profile(profile, tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again == profile
    assert again.layers[0].forward_ms == {1: 0.91, 2: 1.75, 4: 3.4}
    assert again.to_dict() == Profile.from_dict(again.to_dict()).to_dict()


@pytest.mark.parametrize("path, value, field", [
    (("overlap_coefficient",), 0.5, "overlap_coefficient"),
    (("optimizer_ms_per_mparam",), -1.0, "optimizer_ms_per_mparam"),
    (("format",), "other", "format"),
    (("version",), 2, "version"),
    (("allreduce_gbytes_per_s",), {"4_diagonal": 1.0}, "allreduce_gbytes_per_s"),
    (("collective_gbytes_per_s",), {"broadcast": {"2_consec": 1.0}}, "collective_gbytes_per_s"),
    (("collective_gbytes_per_s",), {"all_gather": {"2": 1.0}}, "collective_gbytes_per_s.all_gather"),
    (("layers", 0, "forward_ms"), {"0": 1.0}, "layers[0].forward_ms"),
    (("layers", 0, "forward_ms"), {"1": -1.0}, "layers[0].forward_ms"),
    (("layers", 0, "signature", "hidden_size"), "big", "layers[0].signature.hidden_size"),
    (("layers", 0, "activation_bytes_per_sample"), {"ckpt": 1.0}, "activation_bytes_per_sample"),
])
def test_bad_profiles_name_the_field(path, value, field):
    raw = _doc_example()
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ProfileError, match=re.escape(field)):
        Profile.from_dict(raw)


def test_unreadable_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="line 1"):
        load_profile(bad)


def _profile_for(layer) -> Profile:
    raw = _doc_example()
    raw["layers"][0]["signature"] = {"kind": layer.kind, "hidden_size": layer.hidden_size,
                                     "num_heads": layer.num_heads, "num_kv_heads": layer.kv_heads,
                                     "ffn_hidden_size": layer.ffn_hidden_size, "seq_len": layer.seq_len}
    return Profile.from_dict(raw)


def test_profiled_model_on_our_format(tmp_path):
    model = load_model("tiny-gpt")
    layer = model.layers[0]
    path = tmp_path / "p.json"
    save_profile(_profile_for(layer), path)
    cost = cost_models.get("profiled", load_cluster("dgx-a100-80g"), profile_path=path)
    t = cost.layer_time(layer, LayerStrategy(dp=8), 4, 1)
    assert t.forward_s == pytest.approx(3.4e-3, rel=0.02)  # line through (1, .91) (2, 1.75) (4, 3.4)
    assert t.backward_s == pytest.approx(7.0e-3, rel=0.03)
    m = cost.layer_memory(layer, LayerStrategy(tp=2, dp=4), 2, 3)
    assert m.activations_bytes == 3 * 2 * 38797312
    assert m.parameters_bytes == pytest.approx(50364416 / 2)
    # 4 GPUs consecutive: 200 GB/s busbw; strided 150
    consec = cost.collective_time("all_reduce", 1e9, [[0, 1, 2, 3]])
    strided = cost.collective_time("all_reduce", 1e9, [[0, 2, 4, 6]])
    assert consec == pytest.approx(20e-6 + 1.5 * 1e9 / 200e9)
    assert strided > consec


def test_the_measured_optimizer_step_is_charged_per_local_parameter():
    """0.25 ms per million parameters (the documented example): a 1M-parameter layer's step is
    0.25 ms under DDP and a quarter of it under ZeRO-2 over dp 4; a profile without the figure
    charges nothing."""
    model = load_model("tiny-gpt")
    layer = model.layers[0]
    profile = _profile_for(layer)
    cost = ProfiledModel(load_cluster("cpu-4"), profile=profile)
    assert cost.update_time(1e6, "ddp", 4) == pytest.approx(0.25e-3)
    assert cost.update_time(1e6, "zero2", 4) == pytest.approx(0.25e-3 / 4)
    params = profile.layers[0].parameter_bytes / cost.bytes_per_param
    t = cost.layer_time(layer, LayerStrategy(dp=4, dp_type="zero3"), 1, 1)
    assert t.update_s == pytest.approx(0.25e-3 * params / 1e6 / 4)
    unmeasured = ProfiledModel(load_cluster("cpu-4"), profile=replace(profile, optimizer_ms_per_mparam=0.0))
    assert unmeasured.layer_time(layer, LayerStrategy(dp=4), 1, 1).update_s == 0.0


def test_each_collective_runs_at_its_own_measured_bus_bandwidth():
    """The documented example: all-reduce 180 GB/s bus bandwidth at 2 ranks, reduce-scatter
    160, all-gather 170, 20 us latency. 1 GB over 2 ranks (16-bit profile: wire bytes as
    counted): all-reduce 20 us + 1 x 1e9 / 180e9; reduce-scatter 20 us + 0.5 x 1e9 / 160e9.
    The simulator is told the slowest group's bandwidth over NVLink's and, on the group both
    tables measured, the all-reduce's bus bandwidth over each kind's."""
    model = ProfiledModel(load_cluster("dgx-a100-80g:2"), profile=Profile.from_dict(_doc_example()))
    pair = [[0, 1]]
    assert model.collective_time("all_reduce", 1e9, pair) == pytest.approx(20e-6 + 1e9 / 180e9)
    assert model.collective_time("reduce_scatter", 1e9, pair) == pytest.approx(20e-6 + 0.5e9 / 160e9)
    assert model.collective_time("all_gather", 1e9, pair) == pytest.approx(20e-6 + 0.5e9 / 170e9)
    cal = model.link_calibration()
    nvlink = model.cluster.intra_node.bandwidth_gbytes_per_s
    assert cal["bus_efficiency"] == pytest.approx(150.0 / nvlink)  # the slowest measured group
    assert cal["collective_slowdown"] == pytest.approx({"all_gather": 180.0 / 170.0, "reduce_scatter": 180.0 / 160.0})
    assert cal["base_latency_s"] == pytest.approx(20e-6) and cal["step_latency_factor"] == 0.0


def test_profiled_model_needs_exactly_one_source():
    with pytest.raises(SpecError):
        ProfiledModel(load_cluster("dgx-a100-80g"))


def test_galvatron_llama2_7b_files(galvatron_dir):
    cluster = load_cluster("dgx-a100-80g")
    model = from_galvatron_dir(galvatron_dir, cluster, "llama2-7b")
    spec = model.model_spec
    assert spec.seq_len == 2048
    layer = spec.layers[0]
    # the fit in data/galvatron_llama2_7b/PROVENANCE.md: layer forward ms ~ 3.859 * b + 0.833
    assert model.layer_time(layer, LayerStrategy(dp=8), 4, 1).forward_s == pytest.approx((3.859 * 4 + 0.833) / 1e3, rel=1e-3)
    assert model.layer_time(layer, LayerStrategy(tp=2, dp=4), 4, 1).forward_s == pytest.approx((3.859 * 4 / 2 + 0.833) / 1e3, rel=1e-3)  # intercept not split by tp
    mem = model.layer_memory(layer, LayerStrategy(tp=4, dp=2), 2, 1)
    assert mem.activations_bytes == pytest.approx(2 * 136.885498046875 * 2**20)
    assert mem.states_bytes == pytest.approx(4 * 778.2236328125 * 2**20 / 4)  # 4 x fp32 MB / tp
    assert model.profile.overlap_coefficient == pytest.approx(1.1256, abs=1e-4)
    assert model.bus_bytes_per_s("all_reduce", 4, False) == pytest.approx(155.815e9)
    same = cost_models.get("profiled", cluster, galvatron_dir=galvatron_dir, model="llama2-7b")
    plan = uniform_plan(32, tp=2, dp=4, global_batch=64, micro_batches=2, recompute="full", dp_type="zero2")
    a, b = model.plan_cost(spec, plan), same.plan_cost(spec, plan)
    assert a.iteration_time_s == b.iteration_time_s > 0
    assert 10 * 2**30 < a.peak_memory_bytes < 80 * 2**30


def test_the_vocabulary_s_zero3_and_ulysses_are_not_dropped(galvatron_dir):
    """Galvatron's tables: vocab_zero3 shards the embedding/head states over the 4 dp ranks
    (ZeRO-3 keeps 1/4 of the 16 B/param where ZeRO-2 keeps 2 B + 2/4 + 12/4 B); Ulysses (vocab_sp)
    keeps the weights whole (the tp-1 column of the states table) and syncs them over the
    stage's 8 ranks."""
    cluster = load_cluster("dgx-a100-80g")
    model = from_galvatron_dir(galvatron_dir, cluster, "llama2-7b")
    spec = model.model_spec
    plan = replace(uniform_plan(32, tp=2, dp=4, global_batch=64, micro_batches=2, recompute="full",
                                dp_type="zero2"), vocab_tp=2)
    states = {name: model.vocab_cost(spec, p, 0, 8)[1].parameters_bytes
              for name, p in (("zero2", plan), ("zero3", replace(plan, vocab_zero3=True)),
                              ("ulysses", replace(plan, vocab_sp="ulysses", vocab_zero3=True)))}
    table = model.vocab_memory_mib["pp_off"]["model_states"]
    assert states["zero2"] == pytest.approx(table["2"] * 2**20 * (2 + 2 / 4 + 12 / 4) / 16)
    assert states["zero3"] == pytest.approx(table["2"] * 2**20 / 4)
    assert states["ulysses"] == pytest.approx(table["1"] * 2**20 / 8)


def test_galvatron_two_node_tables_are_picked_for_two_nodes(galvatron_dir):
    model = from_galvatron_dir(galvatron_dir, load_cluster("dgx-a100-80g:2"), "llama2-7b")
    assert model.bus_bytes_per_s("all_reduce", 16, True) == pytest.approx(44.682e9)
    strided = model.collective_time("all_reduce", 1e9, [list(range(0, 16, 2))])
    consec = model.collective_time("all_reduce", 1e9, [list(range(8))])
    assert strided > 5 * consec


def test_parameter_count_follows_the_profiled_dtype():
    layer = load_model("tiny-gpt").layers[0]
    raw = _profile_for(layer).to_dict()
    raw["hardware"]["dtype"] = "float32"  # what the executor writes for a CPU profile
    raw["layers"][0]["parameter_bytes"] = 4 * layer.param_count()
    model = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    n = layer.param_count()
    # fp32 working weights and gradients (4 + 4) beside the fp32 master and Adam states (12);
    # a ZeRO-3 shard is its own master: 16 / dp
    expected = {"ddp": 20 * n, "zero1": 8 * n + 12 * n / 2, "zero2": 4 * n + 16 * n / 2, "zero3": 16 * n / 2}
    for dp_type, nbytes in expected.items():
        states = model.layer_memory(layer, LayerStrategy(dp=2, dp_type=dp_type), 1, 1)
        assert states.states_bytes == pytest.approx(nbytes), dp_type


def _fp32_model(layer) -> ProfiledModel:
    raw = _profile_for(layer).to_dict()
    raw["hardware"]["dtype"] = "float32"  # what the executor writes for a CPU profile
    raw["layers"][0]["parameter_bytes"] = 4 * layer.param_count()
    return ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))


def test_vocab_memory_counts_a_tied_head_once_and_keeps_it_replicated():
    """tiny-gpt ties its head: on one stage the embedding matrix is held once; over two stages
    the last keeps a copy. The executor keeps the tied matrix replicated with a full Adam state
    (20 B/param in fp32) whatever the layers' ZeRO stage; the rest of the embedding (positions)
    follows layer 0: ZeRO-2 at dp 2 is 4 + (4 + 12) / 2 = 12 B/param."""
    model = load_model("tiny-gpt")
    cost = _fp32_model(model.layers[0])
    emb, h, vocab = model.embedding.param_count(), model.head.hidden_size, model.head.output_size
    tied = h * vocab
    one = uniform_plan(4, dp=2, global_batch=4, micro_batches=1)
    assert cost.vocab_cost(model, one, 0, 2)[1].states_bytes == pytest.approx(20 * (emb + model.head.param_count()))
    zero2 = uniform_plan(4, dp=2, dp_type="zero2", global_batch=4, micro_batches=1)
    states = cost.vocab_cost(model, zero2, 0, 2)[1].states_bytes
    assert states == pytest.approx(20 * tied + 12 * (emb - tied + model.head.param_count()))
    two = uniform_plan(4, pp=2, global_batch=4, micro_batches=2)
    first, last = cost.vocab_cost(model, two, 0, 2)[1], cost.vocab_cost(model, two, 1, 2)[1]
    assert first.states_bytes == pytest.approx(20 * emb)
    assert last.states_bytes == pytest.approx(20 * (model.head.param_count() + tied))


def test_a_tied_matrix_syncs_once_per_iteration_under_zero3():
    """The executor keeps the tied matrix replicated whatever the layers' ZeRO stage: its
    gradient is all-reduced once per iteration and it updates in full; only the rest of the
    embedding (the 64 x 128 positions) and of the head (its 256 norm weights) gather and
    reduce-scatter every micro-batch."""
    model = load_model("tiny-gpt")
    cost = _fp32_model(model.layers[0])
    tied, rest = 128 * 512, (64 * 128, 256)
    groups = [[0, 1]]
    _, _, all_reduce = cost._dp_traffic_s(tied, "ddp", groups)
    per_micro_batch = sum(sum(cost._dp_traffic_s(n, "zero3", groups)[:2]) for n in rest)
    for m in (2, 4):
        plan = uniform_plan(4, dp=2, dp_type="zero3", global_batch=4, micro_batches=m)
        time = cost.vocab_cost(model, plan, 0, 2)[0]
        assert time.dp_comm_s == pytest.approx(all_reduce + m * per_micro_batch)
        assert time.update_s == pytest.approx(cost.update_time(tied, "ddp", 2) + cost.update_time(sum(rest), "zero3", 2))


def test_the_loss_keeps_a_softmax_per_micro_batch_in_flight_and_two_gradients_at_its_backward():
    """Per logit (fp32): each micro-batch in flight keeps its softmax (4 B), and under pp the
    pipeline stage also its output, the logits (4 B); the loss's backward adds the gradients of
    the softmax and of the logits (8 B). GPipe over 2 stages with 2 micro-batches of 2 samples
    (4 096 logits per sample): 2 in flight on the last stage; the second micro-batch has all
    of them, so the head's gradients (4 B/param) take the place of one micro-batch's kept
    tensors (first_backward_overlap)."""
    model = load_model("tiny-gpt")
    cost = _fp32_model(model.layers[0])
    logits = 2 * model.head.seq_len * model.head.output_size
    gpipe = uniform_plan(4, pp=2, global_batch=4, micro_batches=2, schedule="gpipe")
    mem = cost.vocab_cost(model, gpipe, 1, 2)[1]
    grads = 4 * (model.head.param_count() + model.head.hidden_size * model.head.output_size)
    assert mem.gradients_bytes == pytest.approx(grads)
    assert mem.activations_bytes == pytest.approx(2 * 8 * logits - min(8 * logits, grads))
    assert mem.temporary_bytes == pytest.approx(8 * logits)
    # 1F1B: the last stage holds one of the two micro-batches, after the first one's gradients
    one_f_one_b = cost.vocab_cost(model, uniform_plan(4, pp=2, global_batch=4, micro_batches=2), 1, 2)[1]
    assert one_f_one_b.activations_bytes == pytest.approx(8 * logits)


def test_the_first_stages_lookup_backward_makes_dense_copies_of_its_tables():
    """tiny-gpt on one stage, micro-batches of one sample: the tied lookup's backward holds
    three copies of the 512 x 128 token table and one of the 64 x 128 position table (fp32),
    after the micro-batch's softmax (4 B per logit, 64 x 512 logits) is freed: 4 (3 x 65 536 +
    8 192) - 4 x 32 768 = 688 128 B, above the Adam step's 8 B x 65 536 and the loss's
    backward's 8 B x 32 768. Over two stages the first stage's copy of the matrix makes one."""
    model = load_model("tiny-gpt")
    cost = _fp32_model(model.layers[0])
    one = uniform_plan(4, dp=2, global_batch=4, micro_batches=2)
    assert cost.vocab_cost(model, one, 0, 2)[1].temporary_bytes == 4 * (3 * 65536 + 8192) - 4 * 32768
    two = uniform_plan(4, pp=2, global_batch=2, micro_batches=2)
    first = cost.vocab_cost(model, two, 0, 2)[1]
    assert first.temporary_bytes == max(4 * (65536 + 8192), 8 * 65536)  # one copy; the Adam step's is larger


def test_gradients_take_the_place_of_activations_when_every_micro_batch_is_in_flight():
    """A layer with A bytes of activations per micro-batch and G of gradients holds n A + G at
    the peak while later micro-batches' backward follows the first's gradients (n < m), but
    (n - 1) A + max(A, G) when all m are in flight at once: the first backward frees one
    micro-batch's activations as it makes the gradients."""
    layer = load_model("tiny-gpt").layers[0]
    cost = _fp32_model(layer)
    s = LayerStrategy(dp=2)
    one = cost.layer_memory(layer, s, 4, 1)
    a, g = one.activations_bytes, one.gradients_bytes
    assert a > g > 0  # tiny-gpt at 4 samples: the min is G
    assert cost.layer_memory_in(layer, s, 4, 1, 1).activations_bytes == pytest.approx(a - g)
    assert cost.layer_memory_in(layer, s, 4, 1, 2).activations_bytes == pytest.approx(a)
    assert cost.layer_memory_in(layer, s, 4, 3, 3).activations_bytes == pytest.approx(3 * a - g)
    assert cost.layer_memory_in(layer, s, 4, 1, 1).gradients_bytes == g  # the states stay as they are
    # checkpointed, one sample: 1 kB kept, less than the gradients: (n - 1) A + max(A, G) = n A - A
    raw = cost.profile.to_dict()
    raw["layers"][0]["activation_bytes_per_sample"]["ckpt"] = 1000
    ckpt = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    s = LayerStrategy(dp=2, recompute="full")
    assert ckpt.layer_memory(layer, s, 1, 2).activations_bytes == 2000
    assert ckpt.layer_memory_in(layer, s, 1, 2, 2).activations_bytes == pytest.approx(1000)


def test_zero2_and_zero3_layers_hold_a_transient_for_their_gradient_sync():
    """ZeRO-2: the layer's full gradients and their flat copy (2 x 2 B/param in bf16); ZeRO-3:
    its gathered weights (2 B/param); DDP and ZeRO-1 nothing; nothing at dp 1."""
    from cost_models.memory import gradient_sync_transient_bytes as transient
    assert transient(1000, "zero2", 4) == 4000
    assert transient(1000, "zero3", 4) == 2000
    assert transient(1000, "zero2", 4, weight_bytes=4) == 8000
    assert transient(1000, "ddp", 4) == transient(1000, "zero1", 4) == transient(1000, "zero2", 1) == 0


def test_an_fp32_profile_moves_four_bytes_per_element():
    """The formulas count 16-bit messages; an fp32 run's all-reduces and sends move twice the
    bytes: same latency, twice the bandwidth term."""
    layer = load_model("tiny-gpt").layers[0]
    raw = _profile_for(layer).to_dict()
    half = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    raw["hardware"]["dtype"] = "float32"
    full = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    latency = half.profile.allreduce_latency_us * 1e-6
    for f in (lambda m: m.collective_time("all_reduce", 1e8, [[0, 1]]), lambda m: m.p2p_time(1e8, 0, 1)):
        assert f(full) - latency == pytest.approx(2 * (f(half) - latency))


def test_zero3_layer_pays_what_its_profiled_table_adds_beyond_compute_and_collectives():
    """A ZeRO-3 table 5 ms (forward) and 8 ms (backward) above the plain layer at every batch
    size: the layer's forward grows by 5 ms less the all-gather charged for it, its backward by
    8 ms less the all-gather and reduce-scatter; as DDP nothing changes."""
    layer = load_model("tiny-gpt").layers[0]
    raw = _profile_for(layer).to_dict()
    plain = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    entry = raw["layers"][0]
    entry["zero3_forward_ms"] = {"2": {b: ms + 5.0 for b, ms in entry["forward_ms"].items()}}
    entry["zero3_backward_ms"] = {"2": {b: ms + 8.0 for b, ms in entry["backward_ms"].items()}}
    timed = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    zero3 = LayerStrategy(dp=2, dp_type="zero3")
    nbytes = entry["parameter_bytes"] / plain.bytes_per_param * 2  # 16-bit messages
    ag = plain.collective_time("all_gather", nbytes, [[0, 1]])
    rs = plain.collective_time("reduce_scatter", nbytes, [[0, 1]])
    a, b = plain.layer_time(layer, zero3, 2, 1), timed.layer_time(layer, zero3, 2, 1)
    assert b.forward_s - a.forward_s == pytest.approx(5e-3 - ag)
    assert b.backward_s - a.backward_s == pytest.approx(8e-3 - ag - rs)
    assert timed.layer_time(layer, LayerStrategy(dp=2), 2, 1) == plain.layer_time(layer, LayerStrategy(dp=2), 2, 1)


def test_our_profiles_charge_the_executors_adam_temporaries(galvatron_dir):
    """The executor's Adam (foreach off) holds two fp32 temporaries of one master tensor: 8 B
    per element of a module's master, its 1/dp shard under ZeRO. A DDP layer has no other
    temporary; Galvatron's folders describe Megatron's fused optimizer: nothing."""
    layer = load_model("tiny-gpt").layers[0]
    cost, n = _fp32_model(layer), layer.param_count()
    assert cost.adam_temporary_bytes(n, "ddp", 2) == 8 * n
    assert cost.adam_temporary_bytes(n, "zero2", 2) == 4 * n
    assert cost.layer_memory(layer, LayerStrategy(dp=2), 1, 1).temporary_bytes == pytest.approx(8 * n)
    assert from_galvatron_dir(galvatron_dir, load_cluster("dgx-a100-80g:8")).adam_temporary_bytes(n, "ddp", 2) == 0


def test_vocabulary_tensor_parallelism_pays_its_collectives():
    """tiny-gpt (sequence 64, hidden 128, one stage of 2 GPUs) at vocab tp 2, micro-batch 4, layers
    tp 2 (the same layout: no relayout): the embedding's partial lookups and the head's input
    gradient are each summed over the pair (4 x 64 x 128 x 2 bytes = 65,536 bytes), and the
    vocab-parallel loss makes three all-reduces of 4 bytes per token (max, sum of exponentials,
    target logit: each waits for the one before, so three latencies); at the documented 180 GB/s bus bandwidth
    and 20 us latency of 2 ranks an all-reduce of B bytes takes 20 us + B / 180e9. Ulysses
    (tokens split, weights whole) pays none. Before, the profiled model charged nothing."""
    from cost_models.vocab import vocab_tp_comm_s
    model = load_model("tiny-gpt")
    cm = ProfiledModel(replace(load_cluster("dgx-a100-80g"), gpus_per_node=2), profile=_profile_for(model.layers[0]))
    ar = lambda nbytes: 20e-6 + nbytes / 180e9  # noqa: E731
    plan = replace(uniform_plan(model.num_layers, tp=2, dp=1, global_batch=4, micro_batches=1), vocab_tp=2)
    vocab, _ = cm.vocab_cost(model, plan, 0, 2)
    assert vocab.tp_comm_s == pytest.approx(2 * ar(4 * 64 * 128 * 2) + 3 * ar(4 * 64 * 4))
    assert vocab_tp_comm_s(cm, model, replace(plan, vocab_sp="ulysses"), 0, 4, [[0, 1]]) == 0.0


def test_embedding_and_head_in_their_own_layout_pay_the_relayout_to_the_layers():
    """The same stage at vocab tp 1 (embedding and head data parallel over the pair, 2 samples
    each) with tp 2 layers (the whole micro-batch of 4 on both): the embedding's output is
    all-gathered into layer 0's layout and the last layer's output split back for the head,
    each an all-gather of 65,536 bytes at the documented 170 GB/s (2 ranks: 20 us + half the
    bytes / 170e9). With dp 2 layers, the vocabulary's own layout, nothing moves. The planners
    see the same term per strategy of the first and last layer (vocab_relayout_time)."""
    model = load_model("tiny-gpt")
    cm = ProfiledModel(replace(load_cluster("dgx-a100-80g"), gpus_per_node=2), profile=_profile_for(model.layers[0]))
    gather = 20e-6 + 0.5 * 65536 / 170e9
    tp2 = uniform_plan(model.num_layers, tp=2, dp=1, global_batch=4, micro_batches=1)
    assert cm.vocab_cost(model, tp2, 0, 2)[0].tp_comm_s == pytest.approx(2 * gather)
    assert cm.vocab_relayout_time(model, tp2, 0, tp2.layers[0]) == pytest.approx(gather)
    dp2 = uniform_plan(model.num_layers, tp=1, dp=2, global_batch=4, micro_batches=1)
    assert cm.vocab_cost(model, dp2, 0, 2)[0].tp_comm_s == 0.0


def test_megatron_sp_layers_take_the_sequence_parallel_tables_less_their_own_collectives():
    """tp and sp tables 10 ms and 14 ms per micro-batch (forward and backward): a tp2 layer
    computes 10 ms less the two all-reduces it holds, an SP layer 14 ms less its two
    reduce-scatters and all-gathers; the collectives are charged apart, so the SP layer's
    pass costs the table. Selective recomputation under SP adds what its measured backward
    (20 ms) adds to the plain one, not the attention core's share of the forward. Without
    the SP tables an SP layer falls back to the tp tables."""
    layer = load_model("tiny-gpt").layers[0]
    raw = _profile_for(layer).to_dict()
    entry = raw["layers"][0]
    flat = lambda ms: {b: ms for b in entry["forward_ms"]}  # noqa: E731
    entry.update(tp_forward_ms={"2": flat(10.0)}, tp_backward_ms={"2": flat(10.0)})
    tp_only = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    entry.update(sp_forward_ms={"2": flat(14.0)}, sp_backward_ms={"2": flat(14.0)},
                 sp_selective_backward_ms={"2": flat(20.0)})
    cm = ProfiledModel(load_cluster("cpu-2"), profile=Profile.from_dict(raw))
    tp, sp = LayerStrategy(tp=2), LayerStrategy(tp=2, sp="megatron")
    nbytes, pair = layer.output_elements(2) * 2, [[0, 1]]
    ar = cm.collective_time("all_reduce", nbytes, pair)
    rs_ag = cm.collective_time("reduce_scatter", nbytes, pair) + cm.collective_time("all_gather", nbytes, pair)
    assert cm.layer_time(layer, tp, 2, 1).forward_s == pytest.approx(10e-3 - 2 * ar)
    t = cm.layer_time(layer, sp, 2, 1)
    assert t.forward_s == pytest.approx(14e-3 - 2 * rs_ag) and t.backward_s == pytest.approx(14e-3 - 2 * rs_ag)
    assert t.forward_s + t.tp_comm_s / 2 == pytest.approx(14e-3)
    selective = cm.layer_time(layer, LayerStrategy(tp=2, sp="megatron", recompute="selective"), 2, 1)
    assert selective.backward_s == pytest.approx(t.backward_s + 6e-3)
    assert tp_only.layer_time(layer, sp, 2, 1).forward_s == pytest.approx(10e-3 - 2 * ar)
