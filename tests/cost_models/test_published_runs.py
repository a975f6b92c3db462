"""The never-fitted validation set of published runs: rows, conversions, what cannot be stated,
and that it shares no run with the calibration data."""
import csv
import math
from dataclasses import replace

import pytest

from benchmarks import published_runs as pr
from specs import Recompute, SpecError, load_model
from specs.datasets import Dataset, data_path


def _run(run_id):
    return next(r for r in pr.load_runs() if r.id == run_id)


def test_every_row_names_its_source_and_a_zoo_model_and_cluster():
    runs = pr.load_runs()
    assert len({r.id for r in runs}) == len(runs) >= 20
    for r in runs:
        assert r.source and load_model(r.model) and pr.cluster_for(r).world_size == r.gpus


def test_measured_time_and_flops_reproduce_the_sources_own_figures():
    run = _run("tt-a100-8b-sac-layer")  # 2904 tokens/s per GPU, 64 GPUs, 64 x 8192 tokens
    model = load_model(run.model).with_seq_len(run.seq_len)
    assert run.measured_iteration_s(model) == pytest.approx(64 * 8192 / (2904 * 64))
    # torchtitan's page says 56.8% MFU of 312 TFLOP/s: 6 N + 12 L h s reproduces it
    assert 2904 * pr.flops_per_token(model, 8192) / 312e12 == pytest.approx(0.568, abs=0.001)
    llama = _run("llama3-405b-8k")  # 430 TFLOP/s per GPU on 8192 GPUs, 2048 x 8192 tokens
    big = load_model(llama.model)
    per_gpu = 430e12 / pr.flops_per_token(big, 8192)
    assert llama.measured_iteration_s(big) == pytest.approx(2048 * 8192 / (per_gpu * 8192))


def test_fp8_and_context_parallel_runs_are_stated():
    assert pr.cannot_state(_run("tt-h100-8b-fsdp8-eager")) == ""
    fp8 = _run("tt-h200-8b-32gpu-fp8")  # torchao tensorwise = per-tensor current scaling
    assert pr.cannot_state(fp8) == ""
    assert {s.precision for s in pr.plan_for(fp8, load_model(fp8.model)).layers} == {"fp8-current"}
    assert pr.cannot_state(replace(fp8, precision="fp8-rowwise")) == "precision fp8-rowwise not modelled yet"
    cp16 = _run("llama3-405b-16k-cp16")  # the ring over 16 ranks, zigzag (Megatron's default)
    assert pr.cannot_state(cp16) == "" and {s.cp for s in pr.plan_for(cp16, load_model(cp16.model)).layers} == {16}
    assert pr.predict(_run("automodel-h100-llama3-70b")).reason == ""
    # Table 5's pipelines at torchtitan's defaults of the time: 8 micro-batches (pp) of 4 from the local 32
    for run_id, schedule, chunks in (("tt-h100-405b-3d-1f1b-fp8", "1f1b", 1),
                                     ("tt-h100-405b-3d-i1f1b-fp8", "interleaved_1f1b", 2)):
        run = _run(run_id)
        plan = pr.plan_for(run, load_model(run.model))
        assert (plan.pp, plan.micro_batches, plan.schedule, plan.virtual_stages) == (8, 8, schedule, chunks)
        assert pr.predict(run).reason == ""
    # the local batch as one micro-batch under pp 8 is refused in one line
    whole = replace(_run("tt-h100-405b-3d-1f1b-fp8"), micro_batch=32)
    assert pr.predict(whole).reason.startswith("the row's plan: micro_batches")


def test_tp_comm_overlap_is_planned_where_the_source_states_it():
    assert {r.id for r in pr.load_runs() if r.tp_comm_overlap} == {
        "mb-25.11-h100-llama3-70b-fp8", "mb-25.11-h100-llama3.1-405b-fp8", "tt-h100-405b-2d-fp8-asynctp",
        "tt-h100-405b-3d-1f1b-fp8", "tt-h100-405b-3d-i1f1b-fp8"}
    for run_id, stack in (("mb-25.11-h100-llama3-70b-fp8", "megatron-te"), ("tt-h100-405b-2d-fp8-asynctp", "compile")):
        run = _run(run_id)
        plan = pr.plan_for(run, load_model(run.model))
        assert plan.tp_comm_overlap and plan.stack == stack and {s.sp for s in plan.layers} == {"megatron"}
    plain = _run("tt-h100-405b-2d-fp8")  # the same run without async TP
    assert not pr.plan_for(plain, load_model(plain.model)).tp_comm_overlap
    assert pr.predict(_run("tt-h100-405b-2d-fp8-asynctp")).predicted_s < pr.predict(plain).predicted_s


def test_a_malformed_overlap_value_is_one_line_naming_the_row(tmp_path, monkeypatch):
    text = data_path(Dataset.PUBLISHED_RUNS).read_text().replace(",none,true,true,,,,flash,", ",none,yes,true,,,,flash,", 1)
    bad = tmp_path / "published_runs.csv"
    bad.write_text(text)
    monkeypatch.setattr(pr, "data_path", lambda dataset: bad)
    with pytest.raises(SpecError, match=r"published_runs\[mb-25.11-h100-llama3-70b-fp8\]: tp_comm_overlap 'yes'"):
        pr.load_runs()


def test_megatron_sp_is_planned_where_the_source_runs_it():
    """torchtitan's TP plan always shards norms and residuals over tp (SequenceParallel),
    Megatron-Bridge's recipes set sequence_parallel and the Llama 3 paper's TP cites Megatron-SP:
    without it the 405B 2D rows' activations would not fit the 96 GiB they ran on."""
    assert {r.id for r in pr.load_runs() if r.sequence_parallel} == {
        r.id for r in pr.load_runs() if r.tp > 1 and r.framework in ("torchtitan", "megatron-bridge", "meta-internal")}
    run = _run("tt-h100-405b-2d")
    assert run.sequence_parallel and not run.tp_comm_overlap
    assert {s.sp for s in pr.plan_for(run, load_model(run.model)).layers} == {"megatron"}
    gpu_gib = pr.cluster_for(run).gpu.memory_gib
    assert pr.predict(run).predicted_gib < gpu_gib < pr.predict(replace(run, sequence_parallel=False)).predicted_gib


def test_overlap_without_sequence_parallel_is_one_line_naming_the_row(tmp_path, monkeypatch):
    text = data_path(Dataset.PUBLISHED_RUNS).read_text().replace(",none,true,true,,,,flash,", ",none,true,false,,,,flash,", 1)
    bad = tmp_path / "published_runs.csv"
    bad.write_text(text)
    monkeypatch.setattr(pr, "data_path", lambda dataset: bad)
    with pytest.raises(SpecError, match=r"published_runs\[mb-25.11-h100-llama3-70b-fp8\]: tp_comm_overlap true needs "
                                        r"sequence_parallel true"):
        pr.load_runs()


def test_bf16_and_fp8_runs_are_summarised_apart():
    predictions = [pr.predict(r) for r in pr.load_runs() if r.gpus <= 128]
    rows = {tuple(r[:3]): r for r in pr.group_rows(predictions)}
    bf16, fp8, every = rows[("all", "bf16", "")], rows[("all", "fp8", "")], rows[("all", "", "")]
    assert bf16[3] + fp8[3] == every[3] == len(predictions)
    assert bf16[4] + fp8[4] == every[4] and fp8[4] > 0
    pairs = {row[0]: row for row in pr.speedup_rows(predictions)}
    run = pairs["tt-h100-405b-2d-fp8"]  # 177 / 109 tokens/s per GPU in the source
    assert run[1] == "tt-h100-405b-2d" and run[2] == pytest.approx(177 / 109)


def test_the_zero3_regime_is_reported_on_its_own():
    predictions = [pr.predict(r) for r in pr.load_runs() if r.gpus <= 128]
    rows = {r[0]: r for r in pr.regime_rows(predictions)}
    assert sum(r[1] for r in rows.values()) == len(predictions)
    fsdp = [p for p in predictions if p.run.dp_type == "zero3" and 9 <= p.run.dp * p.run.cp <= 128]
    assert rows["ZeRO-3 over 9-128 ranks"][1] == len(fsdp) > 0
    assert rows["ZeRO-3 over more than 128 ranks"][1] == 0  # no published run there yet
    errors = [abs(p.error) * 100 for p in fsdp if not p.reason]
    assert rows["ZeRO-3 over 9-128 ranks"][3] == pytest.approx(sum(errors) / len(errors))


def test_fsdp_under_a_pipeline_keeps_its_parameters_and_is_not_zero3():
    """AutoModel's MoE parallelizer and torchtitan's apply_fsdp pass reshard_after_forward=False
    under PP: their pipelined FSDP rows are zero2, as the torchtitan mapping reads that flag. So
    no published ZeRO-3 run shards over more than 128 ranks, and the coverage reach is the 128 of
    torchtitan's FSDP run on 128 H100; DeepSeek-V3 on 1024 H100 (FSDP over 256 ranks) is reported
    with the rest."""
    from cost_models.coverage import measured_zero3_ranks
    pipelined_fsdp = {r.id: r.dp_type for r in pr.load_runs() if r.pp > 1 and r.framework in ("torchtitan", "nemo-automodel")}
    assert pipelined_fsdp == {"tt-h100-405b-3d-1f1b-fp8": "zero2", "tt-h100-405b-3d-i1f1b-fp8": "zero2",
                              "automodel-h100-dsv3-1024": "zero2", "automodel-h100-dsv3-256": "zero2"}
    run = _run("automodel-h100-dsv3-1024")
    prediction = pr.predict(run)
    assert (run.dp * run.cp, prediction.reason) == (256, "")
    assert prediction.measured_s == pytest.approx(37.87, abs=0.02)  # the page's own seconds per step
    rows = {r[0]: r for r in pr.regime_rows([pr.predict(r) for r in pr.load_runs()])}
    assert rows["ZeRO-3 over more than 128 ranks"][1] == 0
    assert measured_zero3_ranks() == max(r.dp * r.cp for r in pr.load_runs() if r.dp_type == "zero3") == 128


def test_moe_rows_split_the_experts_over_ep():
    run = _run("automodel-h100-dsv3-256")  # ep 64 = dp 64: one replica per expert, nothing to shard
    model = load_model(run.model)
    plan = pr.plan_for(run, model)
    moe = [s for s, spec in zip(plan.layers, model.layers) if spec.moe is not None]
    dense = [s for s, spec in zip(plan.layers, model.layers) if spec.moe is None]
    assert moe and dense and {s.ep for s in moe} == {64} and {s.ep for s in dense} == {1}
    assert {s.expert_dp for s in moe} == {1} and {s.expert_dp_kind for s in moe} == {"ddp"}
    wide = pr.plan_for(_run("automodel-h100-dsv3-1024"), model)  # dp 256: 4 expert replicas, sharded
    assert {(s.expert_dp, s.expert_dp_kind) for s in wide.layers if s.ep > 1} == {(4, "zero2")}
    assert _run("tt-a100-8b-sac-layer").ep == 1


def test_the_deepseek_rows_dispatch_by_deepep_and_route_as_their_gate():
    """AutoModel's DeepSeek-V3 rows: TE + DeepEP, and the recipe's fake balanced gate (8 consecutive experts a
    token) as their routing; every other row keeps the all-to-all and the model's own router."""
    stated = {r.id: (r.ep_dispatcher, r.routing) for r in pr.load_runs()}
    assert {k for k, v in stated.items() if v != ("all_to_all", "learned")} == {
        "automodel-h100-dsv3-256", "automodel-h100-dsv3-1024"}
    run = _run("automodel-h100-dsv3-256")
    assert (run.ep_dispatcher, run.routing) == ("deepep", "fake_balanced")
    model = pr.model_for(run)
    assert {s.moe.routing for s in model.layers if s.moe} == {"fake_balanced"}
    assert pr.plan_for(run, model).ep_dispatcher == "deepep"
    plain = pr.predict(replace(run, ep_dispatcher="all_to_all", routing="learned"))
    assert pr.predict(run).predicted_s < plain.predicted_s  # one copy a node, not one an expert


@pytest.mark.parametrize("column, bad", [("ep_dispatcher", "nccl"), ("routing", "random")])
def test_a_malformed_choice_is_one_line_naming_the_row(tmp_path, monkeypatch, column, bad):
    text = data_path(Dataset.PUBLISHED_RUNS).read_text(encoding="utf-8").splitlines()
    rows = list(csv.DictReader(text))
    rows[0][column] = bad
    path = tmp_path / "runs.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=text[0].split(","))
        writer.writeheader()
        writer.writerows(rows)
    monkeypatch.setattr(pr, "data_path", lambda _: path)
    with pytest.raises(SpecError, match=rf"published_runs\[{rows[0]['id']}\]: {column} '{bad}' is not one of"):
        pr.load_runs()


def test_an_empty_ep_reads_as_one(tmp_path, monkeypatch):
    text = data_path(Dataset.PUBLISHED_RUNS).read_text(encoding="utf-8").splitlines()
    header = text[0].split(",")
    assert "ep" in header
    rows = list(csv.DictReader(text))
    rows[0]["ep"] = ""
    path = tmp_path / "runs.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    monkeypatch.setattr(pr, "data_path", lambda _: path)
    assert pr.load_runs()[0].ep == 1


def test_plan_follows_the_row():
    run = _run("tt-a100-8b-sac-layer")
    plan = pr.plan_for(run, load_model(run.model))
    assert [s.recompute for s in plan.layers[:3]] == [Recompute.FULL, Recompute.NONE, Recompute.FULL]
    assert (plan.micro_batches, plan.vocab_zero3, plan.layers[0].dp) == (1, True, 64)
    h405 = _run("tt-h100-405b-2d")
    plan = pr.plan_for(h405, load_model(h405.model))
    assert (plan.vocab_tp, plan.layers[0].tp, plan.global_batch) == (8, 8, 32)


def test_each_row_is_timed_with_its_softwares_kernels():
    eager, nemo, dsv3 = _run("tt-a100-70b-full"), _run("automodel-h100-llama3-70b"), _run("automodel-h100-dsv3-256")
    # AutoModel: its Llama 70B recipe compiles the Hugging Face model; fsdp2-te (DeepSeek V3): TE's fused kernels
    assert (pr.stack_for(eager), pr.stack_for(nemo), pr.stack_for(dsv3)) == ("eager", "compile", "megatron-te")
    as_eager = pr.predict(eager).predicted_s
    assert as_eager > pr.predict(replace(eager, software="megatron-te")).predicted_s


def test_torchtitans_op_policy_rows_are_stated_as_such_and_megatron_cannot_run_them():
    run = _run("tt-h100-8b-fsdp8-eager")
    plan = pr.plan_for(run, load_model(run.model))
    assert {s.recompute for s in plan.layers} == {Recompute.SELECTIVE_OP}
    refused = pr.predict(replace(run, software="megatron-te"))
    assert math.isnan(refused.predicted_s)
    assert "selective-op" in refused.reason and "megatron-te" in refused.reason


def test_validation_and_calibration_sets_share_no_run():
    def key(model, gpus, tp, dp, batch, precision, software):
        return (model, int(gpus), int(tp), int(dp), int(batch), precision, software)
    validation = {key(r.model, r.gpus, r.tp, r.dp, r.global_batch, r.precision, r.software) for r in pr.load_runs()}
    folder = data_path(Dataset.H100_FP8_CALIBRATION)
    with open(folder / "torchtitan_h100_bf16_fp8_pairs.csv", newline="") as f:
        pairs = {key(r["model"], r["gpus"], r["tp"], r["dp"], r["global_batch"], r["precision"], r["software"])
                 for r in csv.DictReader(f)}
    assert pairs and not validation & pairs
    with open(folder / "nemo_24.07_h100_fp8.csv", newline="") as f:
        nemo = list(csv.DictReader(f))
    assert len(nemo) == 12 and not any(r.framework == "nemo" for r in pr.load_runs())


def test_the_benchmark_prints_the_table(capsys):
    assert pr.main([]) == 0
    out = capsys.readouterr().out
    runs = out[out.index("\nrun "):]
    assert "cannot state" not in runs and "25        25" in out  # every run expressible
    assert out.count("cannot state: precision fp8-rowwise") == 4  # the pairs' rowwise runs
    assert "calibrated: a100 (vtrain)" in out and "uncalibrated on H100" in out  # h100-500w: no fit of its own
    assert "calibrated: h100 (nemo-24.07)" in out and "transferred: H100-fitted constants (nemo-24.07) on H200" in out


def test_torchtitans_calibration_pairs_are_reported_twin_by_twin():
    pairs = pr.load_pair_runs()
    runs = {run.id: run for _, run in pairs}
    async_tp, vanilla = runs["70b-tp8-async-bf16"], runs["70b-tp8-vanilla-bf16"]
    assert async_tp.tp_comm_overlap and async_tp.software == "compile" and not vanilla.tp_comm_overlap
    assert async_tp.sequence_parallel and not runs["8b-fsdp8-compile-bf16"].sequence_parallel
    rows = {(r[0], r[1]): r for r in pr.pair_rows([(name, pr.predict(run)) for name, run in pairs])}
    assert len(rows) == 10  # every FP8 run beside its own BF16 twin, vanilla and async apart
    assert rows["70b-tp8-vanilla", "fp8-tensorwise"][2] == pytest.approx(809.8 / 597.3)
    assert rows["70b-tp8-async", "fp8-tensorwise"][2] == pytest.approx(942.4 / 652.4)
    assert rows["70b-tp8-async", "fp8-rowwise"][3] == "cannot state: precision fp8-rowwise not modelled yet"
    assert 1.0 < float(rows["8b-fsdp8-compile", "fp8-tensorwise"][3]) < 2.0


def test_the_simulator_plays_a_small_row_with_the_rows_own_cost_model():
    # --sim: torchtitan's eager kernels and per-op checkpointing, as the analytical model prices them
    p = pr.predict(_run("tt-h100-8b-fsdp8-eager"), sim_max_gpus=8)
    assert p.sim_s == pytest.approx(p.predicted_s, rel=0.02)
    assert math.isnan(pr.predict(_run("tt-h100-8b-fsdp128-eager"), sim_max_gpus=8).sim_s)  # beyond the limit


def test_llama3_pretraining_is_planned_as_the_paper_states_it_and_fits_the_gpu():
    """The Llama 3 paper (section 3.3.2): FSDP keeping parameters unsharded between forward and
    backward (zero2), TP with Megatron-SP, an interleaved schedule of one layer a chunk with the
    embedding and the loss in chunks of their own (126 + 2 = pp 16 x 8), all-gather CP. So stated,
    each 8K row fits the 80 GiB H100 it ran on; read as DDP without SP nor interleaving, it took 230 GiB."""
    for run_id in ("llama3-405b-8k", "llama3-405b-16k", "llama3-405b-16k-cp16"):
        run = _run(run_id)
        plan = pr.plan_for(run, pr.model_for(run))
        assert plan.layers_per_chunk() == (0,) + (1,) * 126 + (0,) and plan.stage_layers == (7,) + (8,) * 14 + (7,)
        assert {(s.dp_type, s.sp) for s in plan.layers} == {("zero2", "megatron")}
        assert pr.predict(run).predicted_gib < pr.cluster_for(run).gpu.memory_gib
    assert {s.cp_comm for s in pr.plan_for(_run("llama3-405b-16k-cp16"), load_model("llama3.1-405b")).layers} == {
        "all_gather"}
    old = replace(_run("llama3-405b-8k"), dp_type="ddp", sequence_parallel=False, virtual_stages=1)
    assert pr.predict(old).predicted_gib > 200


def test_pipelines_are_laid_out_as_megatron_and_torchtitan_split_them():
    """126 layers on pp 8: the embedding and the loss count as layers, so the end stages hold 15
    and the others 16 (torchtitan's generate_split_points: 15, 16 x 6, 15); on pp 8 x v 8 the end
    chunks hold 1 and the others 2; AutoModel gives DeepSeek V3's 61 layers on pp 4 x v 8 two a
    chunk but the last three (one each), so stage 0 holds 16 and the others 15."""
    layouts = {run_id: pr.plan_for(_run(run_id), pr.model_for(_run(run_id))).layers_per_chunk()
               for run_id in ("tt-h100-405b-3d-1f1b-fp8", "mb-25.11-h100-llama3.1-405b-fp8", "automodel-h100-dsv3-256")}
    assert layouts == {"tt-h100-405b-3d-1f1b-fp8": (15,) + (16,) * 6 + (15,),
                       "mb-25.11-h100-llama3.1-405b-fp8": (1,) + (2,) * 62 + (1,),
                       "automodel-h100-dsv3-256": (2,) * 29 + (1, 1, 1)}
    assert pr.plan_for(_run("automodel-h100-dsv3-256"), pr.model_for(_run("automodel-h100-dsv3-256"))).stage_layers == (
        16, 15, 15, 15)


def test_cp_comm_is_read_and_refused_without_cp(tmp_path, monkeypatch):
    """torchtitan's CP rows all-gather K/V (its default rotate method at the rows' commit), as
    AutoModel's does; a cp_comm on a row without cp is one line naming the row."""
    assert {r.id for r in pr.load_runs() if r.cp_comm == "all_gather"} == {
        "tt-h100-8b-cp2-fp8", "tt-h100-8b-cp4-fp8", "tt-h100-8b-cp8-fp8", "automodel-h100-llama3-70b",
        "llama3-405b-16k-cp16"}
    text = data_path(Dataset.PUBLISHED_RUNS).read_text()
    row = next(line for line in text.splitlines() if line.startswith("tt-h100-8b-cp1-fp8,"))
    bad = tmp_path / "published_runs.csv"
    bad.write_text(text.replace(row, row.replace(",false,false,,,,flash,", ",false,false,,,all_gather,flash,", 1)))
    monkeypatch.setattr(pr, "data_path", lambda dataset: bad)
    with pytest.raises(SpecError, match=r"^published_runs\[tt-h100-8b-cp1-fp8\]: cp_comm all_gather needs cp > 1"):
        pr.load_runs()


def test_megatrons_block_recompute_covers_the_first_layers_of_each_chunk(tmp_path, monkeypatch):
    """Megatron-Bridge's 8B H100 FP8 config recomputes 5 layers by the block method: the first 5
    of the one stage in full, the other 27 not; a block count that is not a number is one line."""
    run = _run("mb-25.11-h100-llama3-8b-fp8")
    assert run.recompute == "full-block-5"
    plan = pr.plan_for(run, pr.model_for(run))
    assert [s.recompute for s in plan.layers] == [Recompute.FULL] * 5 + [Recompute.NONE] * 27
    assert pr.layer_recompute("full-block-2", (3, 4, 3)) == [Recompute.FULL] * 2 + [Recompute.NONE] + (
        [Recompute.FULL] * 2 + [Recompute.NONE] * 2 + [Recompute.FULL] * 2 + [Recompute.NONE])
    bad = tmp_path / "published_runs.csv"
    bad.write_text(data_path(Dataset.PUBLISHED_RUNS).read_text().replace(",full-block-5,", ",full-block-x,", 1))
    monkeypatch.setattr(pr, "data_path", lambda dataset: bad)
    with pytest.raises(SpecError, match=r"^published_runs\[mb-25.11-h100-llama3-8b-fp8\]: recompute 'full-block-x' "
                                        r"is not one of none, selective, full, selective-op, full-every-2nd or full-block-N"):
        pr.load_runs()
