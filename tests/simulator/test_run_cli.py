"""python -m simulator.run's conventions: --list, defaults in --help, registered cost models only."""
import pytest

from simulator.run import main


def test_list_prints_the_registries_and_the_zoo(capsys):
    assert main(["--list", "cost-models"]) == 0
    assert capsys.readouterr().out.split() == ["analytical", "profiled"]
    assert main(["--list", "clusters"]) == 0
    assert "dgx-a100-80g" in capsys.readouterr().out.split()


def test_help_shows_defaults_and_refuses_an_unregistered_cost_model(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "ZeRO stage (0: DDP) (default: 0)" in text and "(default: 1f1b)" in text and "`" not in text
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "tiny-gpt", "--cluster", "cpu-4", "--cost-model", "nope"])
    assert exit_info.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
