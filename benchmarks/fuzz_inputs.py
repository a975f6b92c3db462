"""``python -m benchmarks.fuzz_inputs --n 2000``: broken inputs through every file reader and every
CLI's entry function, in-process; prints per target how many ended in a clear one-line error, a
traceback, accepted garbage (a broken-by-construction input taken without an error, or NaN/Infinity
in a JSON output) and a timeout. Plausible mutants that are accepted are re-validated."""
from __future__ import annotations

import contextlib
import io
import json
import random
import re
import signal
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from benchmarks import fuzz_classes, fuzz_frameworks
from benchmarks.fuzz_mutations import Format, Mutant, mutate
from specs import SpecError
from specs.cli import ArgumentParser, count

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("error", "traceback", "garbage", "timeout", "valid")
HF = Format(open_at=lambda path: path == (), null_is_missing=True)
STRICT = Format()
CALIBRATION = Format(open_at=lambda path: path == (),
                     free_at=lambda path: bool(path) and path[0] not in ("format", "version", "constants"))
NUMBERS = Format(open_at=lambda path: True, counts=False)
GALVATRON_PLAN = Format(open_at=lambda path: path == ())
PROFILE = Format(free_at=lambda path: path[:1] == ("hardware",), counts=False)
PLAN_MODEL, PLAN_CLUSTER = "tiny-gpt", "cpu-4"


class FuzzTimeout(BaseException):
    """Raised by the alarm in the main thread: the case ran past its time limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise FuzzTimeout()


# -- seeds ------------------------------------------------------------------------------------------
def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def seed_plans() -> list[dict]:
    from specs import uniform_plan
    return [uniform_plan(4, tp=2, dp=2, global_batch=8, micro_batches=2, model=PLAN_MODEL, cluster=PLAN_CLUSTER).to_dict(),
            uniform_plan(4, tp=2, dp=1, pp=2, global_batch=8, micro_batches=4, model=PLAN_MODEL,
                         cluster=PLAN_CLUSTER, dp_type="ddp").to_dict(),
            uniform_plan(4, tp=2, dp=1, pp=2, global_batch=8, micro_batches=4, model=PLAN_MODEL, cluster=PLAN_CLUSTER,
                         schedule="interleaved_1f1b", virtual_stages=2).to_dict()]


def seeds() -> dict[str, Any]:
    import specs
    from specs.datasets import Dataset, data_path
    galvatron = data_path(Dataset.GALVATRON_LLAMA2_7B)
    doc = (REPO / "docs" / "profile_format.md").read_text()
    return {
        "models": [_json(p) for p in sorted(specs.zoo.MODELS_DIR.glob("tiny-*.json"))]
        + [_json(specs.zoo.MODELS_DIR / f"{n}.json") for n in ("t5-large-48", "swin-huge-32", "vit-large-24")],
        "clusters": [_json(specs.zoo.CLUSTERS_DIR / f"{n}.json") for n in ("cpu-4", "titan-8", "dgx-a100-80g")],
        "plans": seed_plans(),
        "calibration": _json(specs.zoo.ZOO_DIR / "calibration" / "a100.json"),
        "profile": json.loads(re.search(r"```json\n(.*?)```", doc, re.S).group(1)),
        "galvatron_dir": galvatron,
        "galvatron_plan": _json(next(galvatron.glob("galvatron_config_*.json"))),
    }


# -- plan oracle: the rules of a runnable plan, written independently of Plan.validate -------------
def plan_is_runnable(plan: Any, model: Any, world: int) -> bool:
    per_stage, layers = world // plan.pp, plan.layers
    return (world % plan.pp == 0 and len(layers) == model.num_layers
            and sum(plan.stage_layers) == len(layers) and len(plan.stage_layers) == plan.pp
            and (plan.schedule != "1f1b" or plan.micro_batches >= plan.pp)
            and (plan.schedule != "interleaved_1f1b" or _interleavable(plan))
            and all(s.tp * s.ulysses * s.cp * s.dp == per_stage and spec.num_heads % s.tp == 0
                    and plan.global_batch % (s.dp * plan.micro_batches) == 0
                    and (s.dp * s.cp > 1 or s.dp_type == "ddp") for s, spec in zip(layers, model.layers)))


def _interleavable(plan: Any) -> bool:
    """Megatron's interleaving: v > 1 chunks of equal layers round-robin, micro-batches a multiple of pp."""
    v, pp = plan.virtual_stages, plan.pp
    return (v > 1 and pp > 1 and plan.micro_batches % pp == 0 and len(plan.layers) % (pp * v) == 0
            and len(set(plan.stage_layers)) == 1)


# -- targets: each draws one case and returns (run, garbage, what) --------------------------------------
Case = tuple[Callable[[], Any], bool, str]


def _file(tmp: Path, m: Mutant, name: str = "input.json") -> Path:
    path = tmp / name
    path.write_bytes(m.data)
    return path


def reader_model(s: dict, tmp: Path, rng: random.Random) -> Case:
    from specs import load_model
    m = mutate(rng.choice(s["models"]), HF, rng)
    path = _file(tmp, m)
    return (lambda: load_model(path).param_count()), m.garbage, m.what


def reader_cluster(s: dict, tmp: Path, rng: random.Random) -> Case:
    from specs import load_cluster
    if rng.random() < 0.2:
        suffix = rng.choice(["\u0663", "0", "-1", "1000000", "2x", "", " 2", "2", "8"])
        return (lambda: load_cluster(f"cpu-4:{suffix}").world_size), suffix not in ("2", "8"), f"cpu-4:{suffix}"
    m = mutate(rng.choice(s["clusters"]), STRICT, rng)
    path = _file(tmp, m)
    return (lambda: load_cluster(path).world_size), m.garbage, m.what


def reader_plan(s: dict, tmp: Path, rng: random.Random) -> Case:
    from specs import Plan, load_cluster, load_model
    m = mutate(rng.choice(s["plans"]), STRICT, rng)
    path = _file(tmp, m)
    model, cluster = load_model(PLAN_MODEL), load_cluster(PLAN_CLUSTER)

    def run() -> Any:
        plan = Plan.load(path)
        plan.validate(model, cluster)
        if not plan_is_runnable(plan, model, cluster.world_size):
            return "GARBAGE"  # validate passed a plan that cannot run
        return plan
    return run, m.garbage, m.what


def reader_calibration(s: dict, tmp: Path, rng: random.Random) -> Case:
    from cost_models.constants import constants_for
    m = mutate(s["calibration"], CALIBRATION, rng)
    path = _file(tmp, m)
    return (lambda: constants_for(path)), m.garbage, m.what


def reader_profile(s: dict, tmp: Path, rng: random.Random) -> Case:
    from specs.profile_format import load_profile
    m = mutate(s["profile"], PROFILE, rng)
    path = _file(tmp, m)
    return (lambda: load_profile(path).to_dict()), m.garbage, m.what


def reader_galvatron_plan(s: dict, tmp: Path, rng: random.Random) -> Case:
    from specs import load_galvatron_plan
    m = mutate(s["galvatron_plan"], GALVATRON_PLAN, rng)
    path = _file(tmp, m)
    return (lambda: load_galvatron_plan(path, world_size=8)), m.garbage, m.what


def reader_galvatron_dir(s: dict, tmp: Path, rng: random.Random) -> Case:
    from cost_models.profiled import from_galvatron_dir
    from specs import load_cluster, load_model
    folder = tmp / "galvatron"
    folder.mkdir(exist_ok=True)
    from cost_models.galvatron_profile import PROFILE_FILES
    files = sorted(p for pattern in PROFILE_FILES for p in s["galvatron_dir"].glob(pattern))
    for p in files:
        (folder / p.name).write_bytes(p.read_bytes())
    victim = rng.choice(files)
    m = mutate(_json(victim), NUMBERS, rng)
    (folder / victim.name).write_bytes(m.data)
    cluster = load_cluster("dgx-a100-80g")
    return (lambda: from_galvatron_dir(folder, cluster, load_model("llama2-7b"))), m.garbage, f"{victim.name}: {m.what}"


BAD_COUNTS = ["\u0663", "-1", "0", "1e3", "abc", "", "99999999999", "1.5", " 2", "0x2"]


def _arg(rng: random.Random, flags: list[str], good: list[str]) -> tuple[list[str], bool, str]:
    flag = rng.choice(flags)
    value, garbage = (rng.choice(good), False) if rng.random() < 0.3 else (rng.choice(BAD_COUNTS), True)
    if flag == "--zero" and value == "0":  # ZeRO stage 0 is plain data parallelism
        garbage = False
    return [flag, value], garbage, f"{flag} {value!r}"


def cli_simulator(s: dict, tmp: Path, rng: random.Random) -> Case:
    from simulator.run import main
    roll = rng.random()
    argv = ["--json"]
    if roll < 0.4:
        m = mutate(rng.choice(s["plans"]), STRICT, rng)
        argv, garbage, what = [str(_file(tmp, m)), "--json"], m.garbage, f"plan {m.what}"
    elif roll < 0.6:
        m = mutate(rng.choice(s["clusters"]), STRICT, rng)
        argv += ["--model", PLAN_MODEL, "--cluster", str(_file(tmp, m))]
        garbage, what = m.garbage, f"cluster {m.what}"
    elif roll < 0.75:
        m = mutate(s["models"][0], HF, rng)
        argv += ["--model", str(_file(tmp, m)), "--cluster", PLAN_CLUSTER]
        garbage, what = m.garbage, f"model {m.what}"
    else:
        argv += ["--model", PLAN_MODEL, "--cluster", PLAN_CLUSTER]
        if rng.random() < 0.3:
            trace = rng.choice([(str(tmp / "missing" / "t.json"), True), ("/dev/null/t.json", True),
                                (str(tmp), True), (str(tmp / "t.json"), False)])
            extra, garbage, what = ["--trace", trace[0]], trace[1], f"--trace {trace[0]}"
        else:
            extra, garbage, what = _arg(rng, ["--tp", "--pp", "--dp", "--micro-batch", "--global-batch", "--zero"],
                                        ["1", "2", "4"])
        argv += extra
    return (lambda: _cli(main, argv)), garbage, what


def cli_compare(s: dict, tmp: Path, rng: random.Random) -> Case:
    from runners.compare import main
    base = ["--planners", "ddp", "zero3", "--budget-gib", "8", "--no-progress", "--json"]
    model, cluster, batch = [PLAN_MODEL], [PLAN_CLUSTER], ["--global-batch", "8"]
    roll = rng.random()
    extra: list[str] = []
    if roll < 0.3:
        m = mutate(rng.choice(s["clusters"]), STRICT, rng)
        cluster, garbage, what = [str(_file(tmp, m))], m.garbage, f"cluster {m.what}"
    elif roll < 0.5:
        m = mutate(s["models"][0], HF, rng)
        model, garbage, what = [str(_file(tmp, m))], m.garbage, f"model {m.what}"
    else:
        pick = rng.choice([
            (["--planners", ","], True), (["--planners", "nope"], True), (["--planners", "ddp,,zero3"], False),
            (["--global-batch-range", "8", "16"], True), (["--budget-gib", "nan"], True),
            (["--budget-gib", "inf"], True), (["--budget-gib", "-1"], True), (["--budget-gib", "0"], True),
            (["--budget-gib", "1e400"], True), (["--budget-gib", "0.5"], False),
            (["--out", "/dev/null/x"], True), (["--out", str(tmp / "new" / "dir")], False),
            (["--global-batch", "\u0663"], True), (["--global-batch", "0"], True),
            (["--cost-model", "nope"], True), (["--profile", str(tmp / "none.json")], True)])
        extra, garbage, what = pick[0], pick[1], " ".join(pick[0])
    argv = base + ["--model", *model, "--cluster", *cluster] + batch + extra
    return (lambda: _cli(main, argv)), garbage, what


def cli_executor(s: dict, tmp: Path, rng: random.Random) -> Case:
    from executor.run import main
    plan = dict(rng.choice(s["plans"]))
    if rng.random() < 0.5:
        m = mutate(plan, STRICT, rng)
        argv, garbage, what = ["--plan", str(_file(tmp, m))], m.garbage, f"plan {m.what}"
    else:
        argv = ["--plan", str(_file(tmp, Mutant(json.dumps(plan).encode(), False, "")))]
        pick = rng.choice([(["--steps", "\u0663"], True), (["--steps", "-1"], True), (["--world-size", "0"], True),
                           (["--timeout", "nan"], True), (["--timeout", "-5"], True), (["--scale", "hidden=\u0663"], True),
                           (["--scale", "layers=0"], True), (["--model", "nope"], True),
                           (["--timeout", "120"], False)])
        argv, garbage, what = argv + pick[0], pick[1], " ".join(pick[0])
    # accepted inputs really train: one step, a short timeout (a valid plan finishes in seconds)
    return (lambda: _cli(main, ["--steps", "1", "--timeout", "60", "--scale", "hidden=32,seq=16", *argv])), garbage, what


def _cli(main: Callable[[list[str]], int], argv: list[str]) -> Any:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    lines = err.getvalue().strip().splitlines()
    if rc == 2:
        if len(lines) == 1 and lines[0].startswith("error: "):
            raise SpecError("(cli)", lines[0])
        raise RuntimeError(f"exit 2 without a one-line error: {lines[:3]}")
    if re.search(r"\b(NaN|-?Infinity)\b", out.getvalue()):
        return "GARBAGE"
    return rc


TARGETS: dict[str, Callable[[dict, Path, random.Random], Case]] = {
    "load_model": reader_model, "load_cluster": reader_cluster, "Plan.load": reader_plan,
    "load_calibration": reader_calibration, "load_profile": reader_profile,
    "load_galvatron_plan": reader_galvatron_plan, "galvatron profile dir": reader_galvatron_dir,
    "simulator.run": cli_simulator, "planners.compare": cli_compare, "executor.run": cli_executor,
    **fuzz_classes.TARGETS, **fuzz_frameworks.TARGETS,
}
WEIGHTS = {"executor.run": 0.1}
"""executor.run trains for real when its input is valid: a tenth of the share of the others."""
LIMITS_S = {"executor.run": 240}
"""Time limits above --limit-s: a valid executor case spawns ranks that each import torch."""


def classify(run: Callable[[], Any], garbage: bool, limit_s: float) -> tuple[str, str]:
    """Run one case: its outcome and, for anything but a clear error or a valid input, a detail."""
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        result = run()
    except FuzzTimeout:
        return "timeout", ""
    except SpecError as err:
        text = str(err)
        return ("error", "") if "\n" not in text and err.field else ("traceback", f"multi-line: {text[:80]}")
    except BaseException as err:  # noqa: BLE001: every other exception is a traceback for the user
        return "traceback", "".join(traceback.format_exception_only(err)).strip()[:160]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if result == "GARBAGE" or garbage:
        return "garbage", ""
    return "valid", ""


def fuzz(n: int, seed: int, limit_s: float, only: list[str] | None = None) -> tuple[dict, list[str]]:
    """``n`` cases spread over the targets; counts per target and the first few problems."""
    rng = random.Random(seed)
    names = only or list(TARGETS)
    weights = [WEIGHTS.get(t, 1.0) for t in names]
    counts = {t: Counter() for t in names}
    problems: list[str] = []
    signal.signal(signal.SIGALRM, _alarm)
    s = seeds()
    with tempfile.TemporaryDirectory() as tmp_root:
        for i in range(n):
            target = rng.choices(names, weights)[0]
            tmp = Path(tmp_root) / str(i)
            tmp.mkdir()
            run, garbage, what = TARGETS[target](s, tmp, rng)
            outcome, detail = classify(run, garbage, max(limit_s, LIMITS_S.get(target, 0)))
            counts[target][outcome] += 1
            if outcome in ("traceback", "garbage", "timeout") and len(problems) < 40:
                problems.append(f"{target}: {outcome}: {what} {detail}".strip())
    return counts, problems


def table(counts: dict[str, Counter]) -> str:
    rows = [f"{'target':24s} {'cases':>6s} {'clear error':>12s} {'traceback':>10s} {'accepted garbage':>17s} "
            f"{'timeout':>8s} {'valid':>6s}"]
    for name, c in counts.items():
        rows.append(f"{name:24s} {sum(c.values()):6d} {c['error']:12d} {c['traceback']:10d} "
                    f"{c['garbage']:17d} {c['timeout']:8d} {c['valid']:6d}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m benchmarks.fuzz_inputs", description=__doc__)
    p.add_argument("--n", type=count(10**6), default=2000, help="cases in all")
    p.add_argument("--seed", type=count(2**31, minimum=0), default=0)
    p.add_argument("--limit-s", type=count(600), default=25, help="a case running longer is a timeout")
    p.add_argument("--only", nargs="+", choices=list(TARGETS), help="fuzz these targets only")
    args = p.parse_args(argv)
    counts, problems = fuzz(args.n, args.seed, args.limit_s, args.only)
    print(table(counts))
    for line in problems:
        print("  " + line)
    bad = sum(c[k] for c in counts.values() for k in ("traceback", "garbage", "timeout"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
