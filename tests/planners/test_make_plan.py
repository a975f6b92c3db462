"""Self-contained plan files: written from Megatron-style degrees or by compare --out, with the
model and cluster embedded, loading in another folder; Galvatron files detected and converted."""
import json
import shutil

import pytest

from planners import make_plan
from simulator.run import main as simulate_main
from specs import Plan, load_model
from specs.embedded import model_from_data, plan_cluster, plan_model, read_plan
from specs.zoo import MODELS_DIR

DEGREES = ["--cluster", "dgx-h100:2", "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
           "--micro-batch-size", "1", "--global-batch-size", "32"]


def test_megatron_flags_make_the_plan_they_say(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert make_plan.main(["--model", "tiny-llama", *DEGREES, "--use-distributed-optimizer", "--sequence-parallel",
                           "--recompute-granularity", "selective", "--seq-length", "128", "--out", str(out)]) == 0
    assert "tokens/s/GPU" in capsys.readouterr().out
    plan = Plan.load(out)
    s = plan.layers[0]
    assert (plan.pp, s.tp, s.dp, plan.global_batch, plan.micro_batches) == (2, 4, 2, 32, 16)
    assert (s.dp_type, s.sp, s.recompute, plan.vocab_tp) == ("zero1", "megatron", "selective", 4)
    assert plan_model(plan).seq_len == 128  # the embedded model is the one planned, overrides included


def test_plan_file_loads_in_another_folder(tmp_path, monkeypatch, capsys):
    made, elsewhere = tmp_path / "made", tmp_path / "elsewhere"
    made.mkdir(), elsewhere.mkdir()
    shutil.copy(MODELS_DIR / "tiny-llama.json", made / "mine.json")
    monkeypatch.chdir(made)
    assert make_plan.main(["--model", "mine.json", *DEGREES, "--out", "plan.json"]) == 0
    shutil.move(made / "plan.json", elsewhere / "plan.json")
    shutil.rmtree(made)  # the config the plan was made from is gone
    monkeypatch.chdir(elsewhere)
    plan = Plan.load("plan.json")
    assert plan.model == "mine.json" and plan_model(plan) == load_model("tiny-llama")
    assert plan_cluster(plan).world_size == 16
    capsys.readouterr()
    assert simulate_main(["plan.json", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] > 0


def test_embedded_spec_with_an_unknown_field_is_one_line():
    data = json.loads(json.dumps(__import__("dataclasses").asdict(load_model("tiny-gpt"))))
    data["layers"][0]["colour"] = "blue"
    with pytest.raises(Exception, match=r"model_spec.layers\[0\].colour"):
        model_from_data(data)


def test_galvatron_files_are_detected_and_converted(tmp_path, capsys):
    galv = tmp_path / "galvatron.json"
    assert make_plan.main(["--model", "tiny-llama", *DEGREES, "--recompute-granularity", "full",
                           "--to-galvatron", str(galv)]) == 0
    assert "pp_deg" in json.loads(galv.read_text())
    capsys.readouterr()
    assert simulate_main([str(galv)]) == 2
    err = capsys.readouterr().err
    assert "is a Galvatron plan file" in err and "Extra inputs" not in err and len(err.strip().splitlines()) == 1
    assert simulate_main([str(galv), "--model", "tiny-llama", "--cluster", "dgx-h100:2", "--json"]) == 0
    plan = read_plan(galv, 16)
    assert plan.layers[0].recompute == "full" and plan.layers[0].tp == 4
