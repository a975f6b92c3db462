"""Export then import gives the same Plan; what a framework cannot run is refused in one line."""
from __future__ import annotations

from dataclasses import replace

import pytest

import frameworks
from frameworks.base import ExportResult
from specs import DPType, Recompute, SpecError
from tests.frameworks.plans import expressible, llama, plan


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_export_then_import_is_the_same_plan(target):
    model, cluster = llama()
    fw = frameworks.get(target)
    for p in expressible(target):
        result = fw.export(p, model, cluster)
        assert result.assumptions and result.cannot_carry
        assert fw.import_(result.files, model, cluster) == p, p.summary()
        # (DeepSpeed's JSON has no degrees: the launcher's arguments carry them)
        for name in result.files if target != "deepspeed" else ():  # each file alone carries the plan
            assert fw.import_({name: result.files[name]}, model, cluster) == p, (name, p.summary())


def test_galvatron_round_trip():
    model, cluster = llama()
    p = plan(model, cluster, tp=8, dp=2, pp=4, global_batch=64, micro_batches=8, recompute="full", dp_type="zero3")
    fw = frameworks.get("galvatron")
    assert fw.import_(fw.export(p, model, cluster).files, model, cluster) == p


def _one_line(target, p, *words):
    model, cluster = llama()
    with pytest.raises(SpecError) as err:
        frameworks.get(target).export(p, model, cluster)
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_per_layer_mixes_are_refused_naming_the_layer_and_field():
    model, cluster = llama()
    base = plan(model, cluster, tp=8, dp=8, global_batch=64, micro_batches=2, sp="megatron", dp_type="zero1")
    layers = list(base.layers)
    layers[5] = replace(layers[5], dp_type=DPType.ZERO2)
    for target in ("megatron", "torchtitan", "deepspeed"):
        _one_line(target, replace(base, layers=tuple(layers)), "layer 5", "dp_type")
    layers = list(base.layers)
    layers[7] = replace(layers[7], tp=4, dp=16)
    _one_line("megatron", replace(base, layers=tuple(layers)), "layer 7", "tp")


def test_what_each_framework_cannot_run_is_refused():
    model, cluster = llama()
    uly = plan(model, cluster, ulysses=8, dp=8, global_batch=64, micro_batches=8, sp="ulysses", dp_type="zero1")
    _one_line("megatron", uly, "layer 0", "ulysses")
    _one_line("torchtitan", uly, "layer 0", "ulysses")
    z3 = plan(model, cluster, tp=8, dp=8, global_batch=64, micro_batches=2, dp_type="zero3", vocab_zero3=True)
    _one_line("megatron", z3, "layer 0", "zero3")
    z1 = plan(model, cluster, tp=8, dp=8, global_batch=64, micro_batches=2, dp_type="zero1")
    _one_line("torchtitan", z1, "layer 0", "zero1")
    z2pp = plan(model, cluster, tp=8, dp=2, pp=4, global_batch=64, micro_batches=8, dp_type="zero2")
    _one_line("deepspeed", z2pp, "layer 0", "zero2")
    gpipe = plan(model, cluster, tp=8, dp=2, pp=4, global_batch=64, micro_batches=8, schedule="gpipe")
    _one_line("megatron", gpipe, "schedule", "gpipe")
    sel = replace(z1, layers=tuple(replace(s, recompute=Recompute.SELECTIVE) for s in z1.layers))
    _one_line("deepspeed", sel, "layer 0", "selective")
    _one_line("torchtitan", replace(sel, layers=tuple(replace(s, dp_type="zero3") for s in sel.layers)),
              "layer 0", "selective", "selective-op")
    sel_op = replace(z1, layers=tuple(replace(s, recompute=Recompute.SELECTIVE_OP) for s in z1.layers))
    _one_line("megatron", sel_op, "layer 0", "selective-op")
    _one_line("deepspeed", sel_op, "layer 0", "selective-op")
    _one_line("galvatron", replace(sel_op, layers=tuple(replace(s, dp_type="zero3") for s in sel_op.layers)),
              "layer 0", "selective-op")


def test_torchtitans_selective_ac_reads_as_the_per_op_policy_only():
    model, cluster = llama()
    fw = frameworks.get("torchtitan")
    p = next(p for p in expressible("torchtitan") if p.layers[0].recompute == Recompute.SELECTIVE_OP)
    toml = fw.export(p, model, cluster).files["torchtitan.toml"]
    assert 'mode = "selective"' in toml and 'selective_ac_option = "op"' in toml
    # from torchtitan 0.3.0 on "selective" has no option: the per-op policy
    assert fw.import_({"torchtitan.toml": toml.replace('selective_ac_option = "op"\n', "")}, model, cluster) == p
    with pytest.raises(SpecError, match=r"activation_checkpoint.selective_ac_option: '2': every N-th layer"):
        fw.import_({"torchtitan.toml": toml.replace('selective_ac_option = "op"', 'selective_ac_option = "2"')},
                   model, cluster)


def test_megatron_block_recompute_round_trips():
    model, cluster = llama()
    base = plan(model, cluster, tp=8, dp=2, pp=4, global_batch=64, micro_batches=8, sp="megatron")
    layers = [replace(s, recompute=Recompute.FULL if i % 20 < 3 else Recompute.NONE) for i, s in enumerate(base.layers)]
    p = replace(base, layers=tuple(layers))
    fw = frameworks.get("megatron")
    result = fw.export(p, model, cluster)
    assert "--recompute-method block" in result.files["megatron_args.txt"]
    assert fw.import_(result.files, model, cluster) == p
    layers[21] = replace(layers[21], recompute=Recompute.NONE)  # stage 1 keeps a different count
    _one_line("megatron", replace(p, layers=tuple(layers)), "recompute")


def test_imported_degrees_are_checked_against_the_cluster():
    model, cluster = llama()
    with pytest.raises(SpecError, match="cp 3 does not divide"):
        frameworks.get("megatron").import_({"megatron_args.txt": "--context-parallel-size 3"}, model, cluster)
    with pytest.raises(SpecError, match="cp-comm-type"):
        frameworks.get("megatron").import_({"megatron_args.txt": "--context-parallel-size 2 --cp-comm-type a2a"},
                                           model, cluster)
    with pytest.raises(SpecError, match="HSDP"):
        frameworks.get("torchtitan").import_({"torchtitan.toml": "[parallelism]\ndata_parallel_replicate_degree = 2\n"
                                                                  "data_parallel_shard_degree = 4\n"
                                                                  "tensor_parallel_degree = 8\n"}, model, cluster)
    with pytest.raises(SpecError, match="train_batch_size"):
        frameworks.get("deepspeed").import_({"ds_config.json": '{"train_batch_size": 10, '
                                             '"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}'},
                                            model, cluster)


def test_export_result_writes_files_and_notes(tmp_path):
    model, cluster = llama()
    result = frameworks.get("torchtitan").export(expressible("torchtitan")[0], model, cluster)
    paths = result.write(tmp_path / "out")
    assert sorted(p.name for p in paths) == ["NOTES.md", "torchtitan.toml", "torchtitan_args.txt"]
    assert "Cannot carry" in (tmp_path / "out" / "NOTES.md").read_text()
    assert isinstance(result, ExportResult)


def test_command_line_exports_and_imports(tmp_path, capsys):
    from frameworks.export import main
    from specs import Plan
    p = expressible("megatron")[0]
    p.save(tmp_path / "plan.json")
    assert main(["--to", "megatron", str(tmp_path / "plan.json"), "--out", str(tmp_path / "out")]) == 0
    assert main(["--from", "megatron", str(tmp_path / "out" / "megatron_args.txt"), "--model", "llama3-70b",
                 "--cluster", "dgx-h100:8", "--out", str(tmp_path / "back.json")]) == 0
    assert Plan.load(tmp_path / "back.json") == p
    assert main(["--to", "torchtitan", str(tmp_path / "plan.json")]) == 2  # zero1: refused in one line
    err = capsys.readouterr().err.strip()
    assert "zero1" in err and "\n" not in err


def test_cp_plans_are_refused_where_the_files_do_not_carry_cp():  # galvatron's: below
    model, cluster = llama()
    cp = plan(model, cluster, tp=8, cp=2, dp=4, global_batch=64, micro_batches=4, sp="megatron", dp_type="zero1")
    for target in ("torchtitan", "deepspeed"):
        _one_line(target, cp, "layer 0", "cp")
    _one_line("megatron", replace(cp, cp_load_balance="none"), "cp_load_balance", "zigzag")


def _galvatron_cp_plan():
    """pp 2 over 64 GPUs: tp4 cp2 dp4 (zero3), tp2 dp16 (zero2), Ulysses 2 cp2 dp8 (a2a+p2p, zero2)."""
    model, cluster = llama()
    base = plan(model, cluster, tp=4, cp=2, dp=4, pp=2, global_batch=128, micro_batches=8, recompute="full",
                dp_type="zero3")
    layers = list(base.layers)
    layers[10:20] = [replace(layers[0], tp=2, cp=1, dp=16, dp_type=DPType.ZERO2, recompute=Recompute.NONE)] * 10
    layers[50:60] = [replace(layers[0], tp=1, ulysses=2, sp="ulysses", cp=2, cp_comm="a2a+p2p", dp=8,
                             dp_type=DPType.ZERO2)] * 10
    p = replace(base, layers=tuple(layers))
    p.validate(model, cluster)
    return model, cluster, p


def test_galvatron_cp_round_trips_per_layer():
    model, cluster, p = _galvatron_cp_plan()
    fw = frameworks.get("galvatron")
    files = fw.export(p, model, cluster).files
    back = fw.import_(files, model, cluster)
    assert back == p and [s.cp for s in back.layers] == [2] * 10 + [1] * 10 + [2] * 60
    assert back.layers[50].cp_comm == "a2a+p2p" and back.layers[0].cp_comm == "p2p"


@pytest.mark.parametrize("value, words", [
    ("2,2", ["cp_sizes_enc", "2 entries for 80 layers"]),
    (",".join(["2"] * 79 + ["0"]), ["cp_sizes_enc", "layer 79", "cp 0"]),
    (",".join(["2"] * 79 + ["x"]), ["cp_sizes_enc"]),
    (",".join(["2"] * 79 + ["3"]), ["cp_sizes_enc", "layer 79", "cp(3)", "32 GPUs"]),
])
def test_malformed_galvatron_cp_is_refused_in_one_line(value, words):
    import json
    model, cluster, p = _galvatron_cp_plan()
    fw = frameworks.get("galvatron")
    raw = json.loads(fw.export(p, model, cluster).files["galvatron_plan.json"])
    with pytest.raises(SpecError) as err:
        fw.import_({"galvatron_plan.json": json.dumps({**raw, "cp_sizes_enc": value})}, model, cluster)
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    with pytest.raises(SpecError, match="^vcp: vocabulary cp 2"):
        fw.import_({"galvatron_plan.json": json.dumps({**raw, "vcp": 2})}, model, cluster)
    del raw["cp_sizes_enc"]  # a file without the field is cp 1 everywhere
    raw["tp_sizes_enc"] = ",".join(["4"] * 80)
    raw["use_sp"] = raw["sp_sizes_enc"] = ",".join(["0"] * 80)
    assert {s.cp for s in fw.import_({"galvatron_plan.json": json.dumps(raw)}, model, cluster).layers} == {1}


def test_galvatron_refuses_the_cp_options_it_cannot_express():
    model, cluster = llama()
    ag = plan(model, cluster, tp=4, cp=4, dp=1, pp=4, global_batch=16, micro_batches=16, cp_comm="all_gather")
    _one_line("galvatron", ag, "layer 0", "cp_comm all_gather", "zigzag ring")
    _, _, p = _galvatron_cp_plan()
    _one_line("galvatron", replace(p, cp_load_balance="none"), "cp_load_balance none", "zigzag")


@pytest.mark.parametrize("schedule, v, micro_batches, name", [
    ("interleaved_1f1b", 2, 8, "Interleaved1F1B"), ("zbv", 2, 8, "ZBVZeroBubble"),
    ("dualpipev", 2, 8, "DualPipeV"), ("looped_bfs", 2, 8, "LoopedBFS"), ("looped_bfs", 4, 4, "LoopedBFS")])
def test_torchtitan_schedules_round_trip(schedule, v, micro_batches, name):
    model, cluster = llama()
    p = plan(model, cluster, tp=4, dp=4, pp=4, global_batch=64, micro_batches=micro_batches, sp="megatron",
             dp_type="zero2", schedule=schedule, virtual_stages=v)
    fw = frameworks.get("torchtitan")
    result = fw.export(p, model, cluster)
    assert f'pipeline_parallel_schedule = "{name}"' in result.files["torchtitan.toml"]
    assert f"--parallelism.pipeline_parallel_schedule {name}" in result.files["torchtitan_args.txt"]
    for files in (result.files, *({n: text} for n, text in result.files.items())):
        back = fw.import_(files, model, cluster)
        assert back == p
        assert (back.schedule, back.virtual_stages, back.stage_layers, back.layers_per_chunk(), back.micro_batches) == (
            p.schedule, p.virtual_stages, p.stage_layers, p.layers_per_chunk(), p.micro_batches)


def _titan_pp(schedule, **extra):
    keys = {"pipeline_parallel_degree": 4, "pipeline_parallel_schedule": f'"{schedule}"',
            "tensor_parallel_degree": 2, "data_parallel_shard_degree": 8, **extra}
    toml = "[parallelism]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    return {"torchtitan.toml": toml + "[training]\nlocal_batch_size = 8\nglobal_batch_size = 64\n"}


def test_torchtitan_v_schedules_place_their_chunks_as_a_v():
    """torchtitan's own split (the embedding and head each one layer) over 8 chunks, rank k
    running chunks k and 7 - k."""
    model, cluster = llama()
    back = frameworks.get("torchtitan").import_(_titan_pp("zbvzerobubble", pipeline_parallel_layers_per_stage=11),
                                                model, cluster)
    assert (back.schedule, back.virtual_stages) == ("zbv", 2)
    assert back.layers_per_chunk() == (10, 11, 10, 10, 10, 10, 10, 9)
    assert back.stage_layers == (19, 21, 20, 20)
    default = frameworks.get("torchtitan").import_(_titan_pp("DualPipeV", pipeline_parallel_first_stage_less_layers=0,
                                                             pipeline_parallel_last_stage_less_layers=0),
                                                   model, cluster)  # 2 stages per rank without layers_per_stage
    assert (default.schedule, default.virtual_stages, default.stage_layers) == ("dualpipev", 2, (20, 20, 20, 20))


@pytest.mark.parametrize("name", ["InterleavedZeroBubble", "ZeroBubble", "PipelineScheduleMulti"])
def test_unknown_torchtitan_schedule_is_one_line_naming_the_field(name):
    model, cluster = llama()
    with pytest.raises(SpecError) as err:
        frameworks.get("torchtitan").import_(_titan_pp(name), model, cluster)
    text = str(err.value)
    assert "\n" not in text and "parallelism.pipeline_parallel_schedule" in text and name in text, text


def test_zb_h1_is_refused_by_torchtitan_naming_the_schedule():
    model, cluster = llama()
    zb = plan(model, cluster, tp=4, dp=4, pp=4, global_batch=64, micro_batches=8, schedule="zb_h1")
    _one_line("torchtitan", zb, "schedule", "zb_h1", "InterleavedZeroBubble")


@pytest.mark.parametrize("stack, compiled", [("compile", True), ("eager", False), (None, False)])
def test_torchtitan_export_compiles_what_the_plan_timed_compiled(stack, compiled):
    model, cluster = llama()
    plan = replace(expressible("torchtitan")[0], stack=stack)
    files = frameworks.get("torchtitan").export(plan, model, cluster).files
    assert ("[compile]\nenable = true" in files["torchtitan.toml"]) == compiled
    assert ("--compile.enable" in files["torchtitan_args.txt"]) == compiled


def test_tp_comm_overlap_is_written_under_each_frameworks_own_key():
    model, cluster = llama()
    megatron = frameworks.get("megatron").export(expressible("megatron")[-1], model, cluster).files
    assert "--tp-comm-overlap" in megatron["megatron_args.txt"].split()
    assert "comm_overlap:\n  tp_comm_overlap: true" in megatron["megatron_bridge_override.yaml"]
    titan = frameworks.get("torchtitan").export(expressible("torchtitan")[-1], model, cluster).files
    assert "[compile]\nenable = true\nenable_async_tensor_parallel = true" in titan["torchtitan.toml"]
    assert "--compile.enable-async-tensor-parallel" in titan["torchtitan_args.txt"].split()
    # read back: Transformer Engine's overlap under megatron-te, async TP under compile (the round trip above)
    assert frameworks.get("megatron").import_(megatron, model, cluster).stack == "megatron-te"


def test_tp_comm_overlap_is_refused_where_the_files_cannot_carry_it():
    model, cluster = llama()
    overlapped = expressible("megatron")[-1]
    _one_line("deepspeed", replace(expressible("deepspeed")[2], stack="megatron-te", tp_comm_overlap=True),
              "tp_comm_overlap", "DeepSpeed")
    _one_line("galvatron", overlapped, "tp_comm_overlap", "Galvatron")
    # torchtitan's async TP runs under torch.compile only, both ways
    titan = expressible("torchtitan")[-1]
    _one_line("torchtitan", replace(titan, stack="megatron-te"), "tp_comm_overlap", "compile")
    files = frameworks.get("torchtitan").export(titan, model, cluster).files
    # releases before the key moved to [compile] kept it under [parallelism]
    older = files["torchtitan.toml"].replace("enable_async_tensor_parallel = true\n", "").replace(
        "[parallelism]\n", "[parallelism]\nenable_async_tensor_parallel = true\n")
    assert frameworks.get("torchtitan").import_({"torchtitan.toml": older}, model, cluster) == titan
    toml = files["torchtitan.toml"].replace("[compile]\nenable = true", "[compile]\nenable = false")
    with pytest.raises(SpecError) as err:
        frameworks.get("torchtitan").import_({"torchtitan.toml": toml}, model, cluster)
    assert str(err.value).startswith("compile.enable_async_tensor_parallel: true needs compile.enable")


@pytest.mark.parametrize("name", ["megatron", "torchtitan"])
def test_chunks_of_only_the_embedding_and_the_loss_round_trip(name):
    """Llama 3's layout on Llama 3 70B: 80 layers on pp 2 x v 41 = 82 chunks of one layer, the
    first only the embedding and the last only the loss. Megatron writes one layer a chunk with the
    embedding and the loss accounted (Bridge: (80 + 2) / (2 x 1) = 41 chunks a rank), torchtitan
    one layer a stage with the first and last one short."""
    model, cluster = llama()
    p = plan(model, cluster, tp=8, dp=4, pp=2, global_batch=64, micro_batches=2, sp="megatron",
             dp_type="zero1" if name == "megatron" else "zero2")
    p = replace(p, schedule="interleaved_1f1b", virtual_stages=41, chunk_layers=(0,) + (1,) * 80 + (0,),
                stage_layers=(40, 40))
    result = frameworks.get(name).export(p, model, cluster)
    if name == "megatron":
        assert "virtual_pipeline_model_parallel_size: 41" in result.files["megatron_bridge_override.yaml"]
    back = frameworks.get(name).import_(result.files, model, cluster)
    assert (back.virtual_stages, back.layers_per_chunk(), back.stage_layers) == (41, p.layers_per_chunk(), (40, 40))
