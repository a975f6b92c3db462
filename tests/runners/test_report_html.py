"""compare --report: a self-contained HTML page of the user's plan, checked in a real headless
browser when Debian's chromium is installed; the figures and defaults compare prints."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from runners import compare

CHROMIUM = Path("/usr/bin/chromium")
RUN = ["--model", "llama3-8b", "--cluster", "dgx-h100:2", "--planners", "megatron_3d,zero3",
       "--global-batch", "32", "--no-progress"]


def _screenshot(html: Path, png: Path) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        f"--screenshot={png}", "--window-size=1200,1600", html.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert compare.main(RUN + ["--report", str(out / "report.html"), "--json"]) == 0
    return out / "report.html"


def test_report_is_self_contained_and_shows_the_plan(report):
    page = report.read_text()
    assert page.count("<svg") == 3  # throughput vs budget, memory per stage, stage timeline
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "megatron_3d plan for llama3-8b" in page and "tokens/s per GPU" in page and "MFU" in page
    assert "stage 0" in page and "tp" in page


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_report_renders_in_a_headless_browser(report):
    png = report.with_suffix(".png")
    _screenshot(report, png)
    from PIL import Image
    image = Image.open(png).convert("L")
    assert image.size == (1200, 1600)
    low, high = image.getextrema()
    assert high - low > 100  # not a blank page
    dark = sum(image.histogram()[:128])
    assert dark > 0.005 * 1200 * 1600  # text and bars, not a few stray pixels
    print(f"screenshot: {png}")
    keep = os.environ.get("HYBRIDPAR_SCREENSHOT")
    if keep:
        shutil.copy(png, keep)


def test_records_carry_seq_length_and_per_gpu_figures(capsys):
    assert compare.main(RUN + ["--json", "--seq-length", "4096", "--attention", "eager"]) == 0
    rec = next(r for r in json.loads(capsys.readouterr().out) if r["feasible"])
    assert rec["seq_length"] == 4096 and rec["global_batch"] == 32
    assert rec["tokens_per_s_per_gpu"] == pytest.approx(32 * 4096 / rec["iteration_time_s"] / 16)
    assert 0 < rec["mfu"] < 1 and rec["mfu"] == pytest.approx(rec["tflops_per_gpu"] / 989)
    assert rec["tie"] in (True, False)  # dgx-h100's calibration (h100.json) states an error band


def test_a_cluster_without_an_error_band_leaves_ties_unknown(capsys):
    run = ["--cluster" if a == "--cluster" else "h100-500w:2" if a == "dgx-h100:2" else a for a in RUN]
    assert compare.main(run + ["--json"]) == 0
    rec = next(r for r in json.loads(capsys.readouterr().out) if r["feasible"])
    assert rec["tie"] is None  # public-figure defaults: no band known, so not known, not False


def test_default_budget_is_the_gpu_memory_with_the_reserve_shown(capsys):
    assert compare.main(["--model", "llama3-8b", "--cluster", "dgx-h100:2", "--planners", "zero3",
                         "--global-batch", "32", "--no-progress"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    first_row = lines[next(i for i, line in enumerate(lines) if line.startswith("---")) + 1]
    assert first_row.split()[0] == "80"
    assert "budget per GPU: 80 GiB (16 GiB allocator reserve)" in out


def test_precision_fixes_every_plan_and_bad_values_are_one_line(capsys):
    assert compare.main(RUN + ["--precision", "fp4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --precision: 'fp4' is not a choice; choose from search, fp8, bf16, fp8-delayed, fp8-current, mxfp8"
    assert compare.main(RUN + ["--precision", "fp8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all("fp8-current" in r["plan_summary"] for r in rows if r["feasible"])
    assert compare.main(["--model", "llama3-8b", "--cluster", "dgx-h100", "--planners", "zero3",
                         "--global-batch", "8", "--no-progress", "--precision", "mxfp8"]) == 2
    assert capsys.readouterr().err.startswith("error: precision: mxfp8 needs tensor cores with MX block scaling")


def test_same_batch_puts_every_planner_at_one_batch(capsys):
    args = ["--planners", "zero2,megatron_3d", "--budget-gib", "12", "--no-progress", "--json"]
    assert compare.main(args) == 0
    free = {r["planner"]: r["global_batch"] for r in json.loads(capsys.readouterr().out)}
    assert len(set(free.values())) > 1  # the searched batches differ without it
    assert compare.main(args + ["--same-batch"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert len({r["global_batch"] for r in same if r["feasible"]}) == 1


def test_summaries_name_the_bubble_for_pipelines_only():
    import planners
    import simulator
    from specs import load_cluster, load_model, uniform_plan
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-h100")
    budget = planners.Budget(memory_gib=80, global_batch=16)
    flat = planners.plan("zero2", model, cluster, budget)
    piped = planners.plan("gpipe", model, cluster, budget)
    assert flat.plan.pp == 1 and "bubble" not in flat.summary()
    assert piped.plan.pp > 1 and f"{piped.plan.schedule} bubble " in piped.summary()
    assert "bubble" not in simulator.simulate(model, cluster, flat.plan).summary()
    ckpt = uniform_plan(model.num_layers, dp=4, pp=2, global_batch=16, micro_batches=4, recompute="full")
    assert "bubble" in simulator.simulate(model, cluster, ckpt).summary()
    html = piped._repr_html_()
    assert "<table>" in html and "pipeline bubble" in html and "stage" in html


def test_report_spells_recompute_as_the_flags_do():
    from planners.html import plan_table
    from specs import uniform_plan
    page = plan_table(uniform_plan(4, dp=2, global_batch=4, recompute="full"), 2)
    assert "recompute full" in page and "ckpt" not in page
