"""The one Registry: names declared on the class, a third-party planner from an installed package's
entry point (in --list and in a compare table), planner options typed from the command line."""
from __future__ import annotations

import json
import textwrap

import pytest

import cost_models

from runners import compare
from planners.registry import PLANNERS
from specs import SpecError
from specs.registry import Registry

FAST = ["--model", "tiny-gpt", "--cluster", "cpu-4", "--global-batch", "8", "--no-progress", "--budget-gib", "4"]


@pytest.fixture
def thirdparty_package(tmp_path, monkeypatch):
    """An installed distribution on sys.path: a module plus dist-info naming it in hybridpar.planners."""
    (tmp_path / "thirdparty_planner.py").write_text(textwrap.dedent('''
        from planners.baselines import Zero3

        class EveryLayerZero3(Zero3):
            """A third party's planner (here: ZeRO-3 under its own name)."""
            name = "thirdparty_zero3"
    '''))
    info = tmp_path / "thirdparty_planner-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-planner\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[hybridpar.planners]\nthirdparty_zero3 = thirdparty_planner:EveryLayerZero3\n")
    # built-ins loaded first, without the package (their modules register on import, once); then
    # discovered again with it; the registrations before the test are restored afterwards
    PLANNERS.available()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(PLANNERS, "_classes", dict(PLANNERS._classes))
    monkeypatch.setattr(PLANNERS, "_loaded", False)


def test_thirdparty_planner_is_listed_and_planned(thirdparty_package, capsys):
    assert compare.main(["--list", "planners"]) == 0
    listed = capsys.readouterr().out.split()
    assert "thirdparty_zero3" in listed and "galvatron" in listed
    assert compare.main(FAST + ["--planners", "zero3", "thirdparty_zero3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    ours, theirs = [r for r in rows if r[1] == "zero3"], [r for r in rows if r[1] == "thirdparty_zero3"]
    assert len(theirs) == 1 and theirs[0][3] == ours[0][3]  # same search, same samples/s


def test_without_the_package_the_name_is_unknown(capsys):
    assert compare.main(FAST + ["--planners", "thirdparty_zero3"]) == 2
    assert "unknown 'thirdparty_zero3'" in capsys.readouterr().err


def test_registry_takes_the_name_from_the_class_and_refuses_clashes():
    reg: Registry[type] = Registry("widget", [], group="hybridpar.no_such_group")

    class A:
        name = "a"

    class B:
        name = "a"

    class Nameless:
        pass

    assert reg.register(A) is A and reg.available() == ["a"] and reg.get("a") is A
    with pytest.raises(SpecError, match="registered twice"):
        reg.register(B)
    with pytest.raises(SpecError, match="declares no name"):
        reg.register(Nameless)
    with pytest.raises(SpecError, match="unknown 'b'; choose from a"):
        reg.get("b")


def test_options_are_typed_and_reach_the_planner(capsys):
    assert compare.parse_options(["galvatron.mode=exact", "galvatron.top_k=3", "galvatron.stage_imbalance=0.5",
                                  "ddp.x=true"], ["galvatron", "ddp"]) == \
        {"galvatron": {"mode": "exact", "top_k": 3, "stage_imbalance": 0.5}, "ddp": {"x": True}}
    # an option the planner does not take is refused by the planner, in one line
    assert compare.main(FAST + ["--planners", "galvatron", "--option", "galvatron.nope=1", "--json"]) == 2
    assert "galvatron does not take nope" in capsys.readouterr().err
    assert compare.main(FAST + ["--planners", "galvatron", "--option", "galvatron.mode=exact", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["solver_status"] == "optimal"


@pytest.mark.parametrize("item, text", [("nope.mode=exact", "unknown planner 'nope'"),
                                        ("galvatron.mode", "is not PLANNER.KEY=VALUE"),
                                        ("ilp.time_limit_s=5", "which --planners does not run")])
def test_bad_options_are_one_line(item, text):
    with pytest.raises(SpecError, match=text):
        compare.parse_options([item], ["galvatron"])


def test_help_shows_defaults_and_lists(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal width: one flag a line
    with pytest.raises(SystemExit):
        compare.main(["--help"])
    text = capsys.readouterr().out
    assert "(default: bert-huge-32)" in text and "(default: titan-8, the paper's comparison)" in text
    assert "the paper's 8 12 16 20 without" in text and "galvatron_dp_pp galvatron_paper galvatron_classic)" in text
    names = cost_models.available()  # other tests may have registered more
    assert {"analytical", "profiled", "galvatron"} <= set(names)
    assert "`" not in text and "{" + ",".join(names) + "}" in text
    assert compare.main(["--list", "cost-models"]) == 0
    assert capsys.readouterr().out.split() == names
