"""The hybridpar command: subcommands start the modules' own command lines; a TOML job file
under command-line flags; Megatron flags imported as a plan."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hybridpar.cli import SUBCOMMANDS, main
from runners.compare import grid_from_args, parse_args
from specs import Plan, SpecError

ROOT = Path(__file__).resolve().parents[2]


def test_console_script_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["hybridpar"] == "hybridpar.cli:main"


def test_config_file_and_override_make_the_grid(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('model = "llama3-8b"\ncluster = "dgx-h100:4"\nbudget-gib = [60, 80]\nglobal_batch = 256\n'
                   'planners = ["megatron_3d", "galvatron"]\nsame_batch = true\n'
                   '[option]\ngalvatron.time_limit_s = 120\ngalvatron.mode = "exact"\n')
    args = parse_args(["--config", str(job), "--budget-gib", "70", "--global-batch-range", "64", "128",
                       "--option", "galvatron.time_limit_s=30"])
    grid = grid_from_args(args)
    assert (grid.model, grid.cluster, grid.planners) == ("llama3-8b", "dgx-h100:4", ("megatron_3d", "galvatron"))
    assert [b.memory_gib for b in grid.budgets] == [70.0]  # the command line wins
    # --global-batch-range excludes the file's global_batch: the command line's choice stands alone
    assert grid.budgets[0].global_batch is None and grid.budgets[0].global_batch_range == (64, 128)
    # the command line's --objective (default auto) reaches every planner; the file's options merge under it
    assert grid.options == {"galvatron": {"time_limit_s": 30, "mode": "exact", "objective": "auto"},
                            "megatron_3d": {"objective": "auto"}}
    assert args.same_batch is True


def test_config_file_alone_sets_every_key(tmp_path):
    args = parse_args(["--config", str(ROOT / "configs" / "llama3-70b-h100-64.toml")])
    grid = grid_from_args(args)
    assert (grid.model, grid.cluster) == ("llama3-70b", "dgx-h100:8")
    assert grid.budgets[0].global_batch == 512 and len(grid.budgets) == 1


@pytest.mark.parametrize("text, field, words", [
    ('modle = "llama3-8b"\n', "modle", "unknown key"),
    ('budget_gib = ["x"]\n', "--budget-gib", "decimal number"),
    ('model = ["a", "b"]\n', "model", "takes one value"),
    ('json = 1\n', "json", "true or false"),
    ('model = \n', "config", "not TOML"),
])
def test_bad_config_is_one_line_naming_the_key(tmp_path, text, field, words):
    job = tmp_path / "job.toml"
    job.write_text(text)
    with pytest.raises(SpecError) as err:
        parse_args(["--config", str(job)])
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{job}: {field}: ") and words in line


def test_subcommands_reach_their_modules(capsys):
    assert main(["list", "frameworks"]) == 0
    assert capsys.readouterr().out.split() == ["deepspeed", "galvatron", "megatron", "torchtitan"]
    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err.strip() == ("error: subcommand: unknown 'frobnicate'; choose from "
                                               + ", ".join(SUBCOMMANDS))


@pytest.mark.parametrize("name", ["plan", "simulate", "export"])
def test_help_names_the_subcommand_and_shows_defaults(capsys, monkeypatch, name):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside the defaults
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: hybridpar {name} ")
    if name == "plan":
        assert "(default: bert-huge-32)" in out and "(default: analytical)" in out


def test_import_megatron_flags_writes_the_plan_and_exports_back(tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    assert main(["import", "megatron", "--model", "llama3-8b", "--cluster", "dgx-h100:2", "--out", str(plan_file),
                 "--", "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
                 "--micro-batch-size", "2", "--global-batch-size", "64", "--use-distributed-optimizer"]) == 0
    plan = Plan.load(plan_file)
    assert (plan.pp, plan.layers[0].tp, plan.layers[0].dp, plan.global_batch, plan.micro_batches) == (2, 4, 2, 64, 16)
    assert {str(s.dp_type) for s in plan.layers} == {"zero1"}
    capsys.readouterr()
    assert main(["export", "megatron", str(plan_file), "--out", str(tmp_path / "mg")]) == 0
    args = (tmp_path / "mg" / "megatron_args.txt").read_text()
    assert "--tensor-model-parallel-size 4" in args and "--pipeline-model-parallel-size 2" in args


def test_flags_after_dashes_only_for_a_command_line_framework(capsys):
    assert main(["import", "deepspeed", "--model", "llama3-8b", "--cluster", "dgx-h100:2", "--", "--x", "1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --: deepspeed takes files, not flags after --"


def test_default_planners_are_the_papers_without_a_cluster_and_todays_with_one():
    from planners import CLUSTER_PLANNERS, DEFAULT_PLANNERS
    assert grid_from_args(parse_args([])).planners == DEFAULT_PLANNERS
    assert "galvatron_classic" in DEFAULT_PLANNERS and "galvatron" in CLUSTER_PLANNERS
    grid = grid_from_args(parse_args(["--model", "llama3-70b", "--cluster", "dgx-h100:8"]))
    assert grid.planners == CLUSTER_PLANNERS
