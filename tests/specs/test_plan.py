"""Plan: JSON round trip, validation rules and their messages, Galvatron plan files."""
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specs import (LayerStrategy, Plan, SpecError, load_cluster, load_galvatron_plan, load_model, model_from_dict,
                   plan_from_galvatron, plan_to_galvatron, uniform_plan)

BERT = load_model("bert-huge-32")
TITAN = load_cluster("titan-8")

strategies = st.builds(
    LayerStrategy, tp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 4]),
    dp_type=st.sampled_from(["ddp", "zero1", "zero2", "zero3"]), tp_consecutive=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]), sp=st.sampled_from(["none", "megatron", "ulysses"]))


@st.composite
def plans(draw):
    layers = draw(st.lists(strategies, min_size=1, max_size=12))
    pp = draw(st.integers(1, len(layers)))
    cuts = sorted(draw(st.lists(st.integers(1, len(layers) - 1), min_size=pp - 1, max_size=pp - 1,
                                unique=True))) if pp > 1 else []
    bounds = [0, *cuts, len(layers)]
    stage_layers = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    # the interleaved schedule's parameter: every chunk holds a layer
    v = draw(st.sampled_from([v for v in (1, 2, 4) if min(stage_layers) >= v]))
    return Plan(pp=len(stage_layers), stage_layers=stage_layers, layers=tuple(layers),
                global_batch=draw(st.integers(1, 512)), micro_batches=draw(st.integers(1, 16)),
                schedule=draw(st.sampled_from(["gpipe", "1f1b"])) if v == 1 else "interleaved_1f1b",
                model="m", cluster="c",
                vocab_tp=draw(st.sampled_from([1, 2, 8])), vocab_zero3=draw(st.booleans()),
                vocab_sp=draw(st.sampled_from(["none", "megatron", "ulysses"])),
                virtual_stages=v)


@settings(max_examples=60, deadline=None)
@given(plans())
def test_plan_json_round_trips_exactly(plan):
    assert Plan.from_dict(json.loads(plan.to_json())) == plan


def test_save_and_load(tmp_path):
    plan = uniform_plan(32, tp=2, dp=4, global_batch=32, micro_batches=2, model="bert-huge-32")
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json") == plan
    assert json.loads((tmp_path / "p.json").read_text())["version"] == 2


def test_valid_plan_passes():
    uniform_plan(32, tp=2, dp=2, pp=2, global_batch=16, micro_batches=4).validate(BERT, TITAN)


@pytest.mark.parametrize("plan, message", [
    (uniform_plan(32, tp=4, dp=4, global_batch=32), r"layer 0: dp\(4\) \* tp\(4\) = 16 != 8 GPUs of stage 0"),
    (uniform_plan(32, tp=2, dp=4, global_batch=10, micro_batches=1),
     r"global_batch\(10\) is not divisible by dp\(4\)\*micro_batches\(1\) = 4"),
    (uniform_plan(32, tp=1, dp=2, pp=4, global_batch=16, micro_batches=2),
     r"1f1b needs micro_batches\(2\) >= pp\(4\)"),
    (uniform_plan(30, tp=1, dp=8, global_batch=16), "30 strategies for a model of 32 layers"),
    (uniform_plan(32, tp=1, dp=2, pp=3, global_batch=12, micro_batches=3), r"pp\(3\) does not divide"),
])
def test_validation_rules_name_field_and_numbers(plan, message):
    with pytest.raises(SpecError, match=message):
        plan.validate(BERT, TITAN)


def test_tp_must_divide_heads():
    model = model_from_dict({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 2,
                             "n_positions": 128, "vocab_size": 1000})
    plan = uniform_plan(2, tp=8, dp=1, global_batch=8)
    with pytest.raises(SpecError, match=r"layer 0: tp\(8\) does not divide heads\(12\)"):
        plan.validate(model, TITAN)


def test_every_layer_in_exactly_one_stage():
    with pytest.raises(SpecError, match=r"stage_layers: sum 31 != 32 layers"):
        Plan(pp=2, stage_layers=(16, 15), layers=(LayerStrategy(),) * 32, global_batch=8, micro_batches=2)
    with pytest.raises(SpecError, match=r"3 stages listed for pp\(2\)"):
        Plan(pp=2, stage_layers=(10, 10, 12), layers=(LayerStrategy(),) * 32, global_batch=8, micro_batches=2)


def test_zero_without_dp_is_rejected():
    plan = replace(uniform_plan(32, tp=8, dp=1, global_batch=8), layers=(LayerStrategy(tp=8, dp_type="zero3"),) * 32)
    with pytest.raises(SpecError, match="dp_type zero3 needs dp > 1"):
        plan.validate(BERT, TITAN)


@pytest.mark.parametrize("raw, field", [
    ("[]", "(top level)"),
    ('{"layers": 3}', "layers"),
    ('{"version": 9, "layers": []}', "version"),
    ('{"pp": 1, "stage_layers": [1], "global_batch": 8, "micro_batches": 1, "layers": [{"tp": 0}]}',
     "layers[0].tp"),
    ('{"pp": 1, "stage_layers": [1], "global_batch": 8, "micro_batches": 1, "layers": [{"tp": 1, "zoom": 2}]}',
     "layers[0].zoom"),
    ('{"pp": 1, "stage_layers": [1], "micro_batches": 1, "layers": [{}]}', "global_batch"),
    ('{"pp": 1, "stage_layers": [1], "global_batch": 8, "micro_batches": 1, "colour": 1, "layers": [{}]}',
     "colour"),
    ('{"pp": 1, "stage_layers": [1], "global_batch": "8", "micro_batches": 1, "layers": [{}]}', "global_batch"),
    ('{"pp": 1, "stage_layers": 1, "global_batch": 8, "micro_batches": 1, "layers": [{}]}', "stage_layers"),
    ('{"pp": 1, "stage_layers": [1], "global_batch": 8, "micro_batches": 1, "schedule": "zb", "layers": [{}]}',
     "schedule"),
])
def test_broken_plan_files_give_one_line_errors(tmp_path, raw, field):
    path = tmp_path / "plan.json"
    path.write_text(raw)
    with pytest.raises(SpecError) as err:
        Plan.load(path)
    assert err.value.field == field and str(err.value).startswith(str(path)) and "\n" not in str(err.value)


@st.composite
def galvatron_plans(draw, world: int = 8):
    """Plans Galvatron's files can express: a stage width dividing the world, one default dp type
    besides zero3, and (with pp > 1) any stage partition, so pp_division round-trips too."""
    pp = draw(st.sampled_from([1, 2, 4]))
    per_stage = world // pp
    n = draw(st.integers(pp, 12))
    cuts = sorted(draw(st.lists(st.integers(1, n - 1), min_size=pp - 1, max_size=pp - 1,
                                unique=True))) if pp > 1 else []
    bounds = [0, *cuts, n]
    default = draw(st.sampled_from(["ddp", "zero2"]))
    layers = []
    for _ in range(n):
        tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if per_stage % t == 0]))
        dp = per_stage // tp
        sp = draw(st.sampled_from(["none", "ulysses"])) if tp > 1 else "none"
        synced = dp > 1 or sp == "ulysses"  # Ulysses layers sync gradients over ulysses * dp ranks
        dp_type = draw(st.sampled_from([default, "zero3"])) if synced else "ddp"
        split = {"tp": 1, "ulysses": tp} if sp == "ulysses" else {"tp": tp}  # a group of tp ranks either way
        layers.append(LayerStrategy(dp=dp, dp_type=dp_type, recompute=draw(st.sampled_from(["none", "full"])),
                                    tp_consecutive=draw(st.booleans()) if 1 < tp < per_stage else True, sp=sp,
                                    **split))
    return Plan(pp=pp, stage_layers=tuple(b - a for a, b in zip(bounds, bounds[1:])), layers=tuple(layers),
                global_batch=draw(st.integers(1, 512)), micro_batches=draw(st.integers(1, 16)),
                schedule=draw(st.sampled_from(["gpipe", "1f1b"])), vocab_tp=draw(st.sampled_from([1, 2])),
                vocab_zero3=draw(st.booleans()), vocab_sp=draw(st.sampled_from(["none", "ulysses"])))


@settings(max_examples=60, deadline=None)
@given(galvatron_plans())
def test_galvatron_export_import_round_trip(plan):
    assert plan_from_galvatron(plan_to_galvatron(plan), world_size=8) == plan


def test_reads_galvatrons_own_plan_file(galvatron_dir):
    path = galvatron_dir / "galvatron_config_llama2-7b_1nodes_8gpus_per_node_36GB_bf16.json"
    plan = load_galvatron_plan(path, world_size=8)
    assert (plan.pp, plan.global_batch, plan.micro_batches, plan.vocab_tp) == (1, 16, 1, 2)
    assert {s.dp_type for s in plan.layers} == {"zero3"}
    assert sum(s.checkpoint for s in plan.layers) == 20
    plan.validate(load_model("llama2-7b"), load_cluster("dgx-a100-80g"))


def test_galvatron_file_with_bad_field():
    with pytest.raises(SpecError, match=r"tp_consecutive_flags: 1 entries for 2 layers"):
        plan_from_galvatron({"pp_deg": 1, "tp_sizes_enc": "1,1", "tp_consecutive_flags": "1",
                             "global_bsz": 8, "chunks": 1}, world_size=8)
    with pytest.raises(SpecError, match="tp_sizes_enc: layer 1: tp.3. does not divide 8"):
        plan_from_galvatron({"pp_deg": 1, "tp_sizes_enc": "1,3", "global_bsz": 8}, world_size=8)
