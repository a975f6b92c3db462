"""python -m simulator.run's conventions: --list, defaults in --help, registered cost models only."""
import pytest

from simulator.run import main
from specs import uniform_plan


def test_list_prints_the_registries_and_the_zoo(capsys):
    assert main(["--list", "cost-models"]) == 0
    assert {"analytical", "profiled", "galvatron"} <= set(capsys.readouterr().out.split())
    assert main(["--list", "clusters"]) == 0
    assert "dgx-a100-80g" in capsys.readouterr().out.split()


def test_help_shows_defaults_and_refuses_an_unregistered_cost_model(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "ZeRO stage (0: DDP) (default: 0)" in text and "(default: 1f1b)" in text and "`" not in text
    # a bad argument is one line naming it, like any bad input (specs.cli.ArgumentParser)
    assert main(["--model", "tiny-gpt", "--cluster", "cpu-4", "--cost-model", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: --cost-model: invalid choice: 'nope'")


def test_the_analytical_models_stack_comes_from_the_flag_or_the_plan(tmp_path, capsys):
    # torchtitan's per-op checkpointing is priced only under an eager or compile stack
    flags = ["--model", "tiny-llama", "--cluster", "cpu-4", "--dp", "4", "--global-batch", "4",
             "--recompute", "selective-op", "--json"]
    assert main(flags) == 2
    assert "recompute selective-op (supported: none, selective, full)" in capsys.readouterr().err
    assert main(flags + ["--stack", "eager"]) == 0
    plan = uniform_plan(4, dp=4, global_batch=4, recompute="selective-op", stack="compile", model="tiny-llama",
                        cluster="cpu-4")
    (tmp_path / "plan.json").write_text(plan.to_json())
    capsys.readouterr()
    assert main([str(tmp_path / "plan.json"), "--json"]) == 0
    assert main(flags + ["--stack", "eager", "--cost-model", "galvatron"]) == 2
    assert "--stack: the software stack is the analytical model's" in capsys.readouterr().err
