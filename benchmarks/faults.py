"""``python -m benchmarks.faults``: real faults against the executor's launcher and a sweep, each in
its own process tree: SIGKILL and SIGSTOP of every rank, of the launcher and of a sweep's parent
(and SIGKILL of a sweep worker). Prints per fault the time to end, the cause the run named,
the processes left 30 s later at most, the files left behind, and whether a re-run of a killed
sweep writes the same files as a run that was never killed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from specs.cli import ArgumentParser

REPO = Path(__file__).resolve().parents[1]
WORLD = 3
HEARTBEAT_S = 5.0
"""The heartbeat timeout the rank faults run with (the launcher's default is 30 s)."""
LEFT_AFTER_S = 30.0
COMPARE = ["-m", "planners.compare", "--model", "tiny-gpt", "--cluster", "cpu-4", "--budget-gib", "2", "4", "8",
           "--global-batch", "8", "--no-progress"]


# -- what runs inside the ranks (module level: spawn pickles it by name) ---------------------------------
def _victim_rank(rank: int, world: int, victim: int, sig: int) -> int:
    import torch.distributed as dist
    from executor.launch import progress
    progress({"pid": os.getpid()})
    dist.barrier()
    if rank == victim:
        progress({"signal_at": time.time()})
        time.sleep(0.2)  # the launcher reads the record before the signal
        os.kill(os.getpid(), sig)
    dist.barrier()
    return rank


def _sleeping_rank(rank: int, world: int) -> int:
    from executor.launch import progress
    progress({"pid": os.getpid()})
    time.sleep(20)
    return rank


def driver(kind: str, progress_path: str, victim: int = -1, sig: int = 0) -> int:
    """Inside the launcher's process: one run; prints the outcome as one JSON line."""
    from executor.launch import LaunchError, launch
    try:
        if kind == "rank":
            launch(_victim_rank, WORLD, victim, sig, timeout_s=300, heartbeat_timeout_s=HEARTBEAT_S,
                   progress_path=progress_path)
        else:
            launch(_sleeping_rank, WORLD, timeout_s=300, progress_path=progress_path)
        cause = "completed"
    except LaunchError as err:
        cause = str(err).splitlines()[0]
    print(json.dumps({"cause": cause, "ended_at": time.time()}))
    return 0


# -- the faults ---------------------------------------------------------------------------------------
def _records(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _left(pids: list[int]) -> int:
    """How many of ``pids`` are alive once all are gone or LEFT_AFTER_S has passed."""
    end = time.monotonic() + LEFT_AFTER_S
    while any(map(_alive, pids)) and time.monotonic() < end:
        time.sleep(0.2)
    return sum(map(_alive, pids))


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}


def _start_driver(tmp: Path, args: list[str]) -> tuple[subprocess.Popen, Path]:
    progress = tmp / "progress.jsonl"
    cmd = [sys.executable, "-c", "import sys; from benchmarks.faults import driver; "
           f"sys.exit(driver({args[0]!r}, {str(progress)!r}, *map(int, {args[1:]!r})))"]
    return subprocess.Popen(cmd, env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), progress


def rank_fault(victim: int, sig: signal.Signals) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        proc, progress = _start_driver(tmp, ["rank", str(victim), str(int(sig))])
        out, _ = proc.communicate(timeout=900)
        result = json.loads(out.strip().splitlines()[-1])
        records = _records(progress)
        hit = [r["signal_at"] for r in records if "signal_at" in r]
        pids = [r["pid"] for r in records if "pid" in r]
        for pid in pids:  # a stopped rank that outlived the run would never end by itself
            _continue(pid)
        return {"fault": f"{sig.name} rank {victim}", "time_to_end_s": result["ended_at"] - hit[0] if hit else None,
                "cause": result["cause"], "left": _left(pids) if pids else 0,
                "files_left": _files_left(tmp, ["progress.jsonl"])}


def launcher_fault(sig: signal.Signals) -> dict[str, Any]:
    """The launcher SIGKILLed (its ranks must die with it) or stopped for 5 s, then continued."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        proc, progress = _start_driver(tmp, ["launcher"])
        pids = _wait_for_pids(progress, WORLD, proc)
        start = time.time()
        proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            time.sleep(5)
            proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=900)
        ended = time.time()
        cause = json.loads(out.strip().splitlines()[-1])["cause"] if out.strip() else \
            f"launcher killed ({signal.Signals(-proc.returncode).name})"
        if sig == signal.SIGKILL:  # the ranks end when they notice: time until the last is gone
            while any(map(_alive, pids)) and time.time() - start < LEFT_AFTER_S:
                time.sleep(0.1)
            ended = time.time()
            cause += f"; ranks gone: {not any(map(_alive, pids))}"
        else:
            cause = f"stopped 5 s, continued: {cause}"
        left = _left(pids)
        files = _files_left(tmp, ["progress.jsonl"])
        if files:  # a SIGKILLed launcher cannot clean up: the next launch removes its folder
            subprocess.run([sys.executable, "-c", "from executor.launch import _remove_orphaned_dump_dirs as r; r()"],
                           env=_env(tmp), check=True)
            cause += "; its temp folder removed by the next launch"
            files = _files_left(tmp, ["progress.jsonl"])
        return {"fault": f"{sig.name} launcher", "time_to_end_s": ended - start, "cause": cause,
                "left": left, "files_left": files}


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _wait_for_pids(progress: Path, count: int, proc: subprocess.Popen, limit_s: float = 600) -> list[int]:
    end = time.monotonic() + limit_s
    while time.monotonic() < end and proc.poll() is None:
        pids = [r["pid"] for r in _records(progress) if "pid" in r]
        if len(pids) >= count:
            return pids
        time.sleep(0.2)
    raise RuntimeError(f"the run did not start its {count} processes in {limit_s:.0f} s")


def _files_left(tmp: Path, expected: list[str]) -> list[str]:
    """What is in the run's temp dir besides the files it was asked to write."""
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.name not in expected and p.parent == tmp
                  and p.name not in ("out", "clean"))


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += map(int, (task / "children").read_text().split())
        except OSError:
            pass
    return kids


def sweep_fault(target: str, sig: signal.Signals) -> dict[str, Any]:
    """planners.compare --workers 2: its parent or one worker signalled once both workers run;
    then a re-run with the same --out, compared with a clean run."""
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        proc = subprocess.Popen([sys.executable, *COMPARE, "--workers", "2", "--out", str(tmp / "out")], env=_env(tmp),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        workers = _wait_for_children(proc, 2)
        victim = proc.pid if target == "parent" else workers[0]
        start = time.time()
        os.kill(victim, sig)
        if sig == signal.SIGSTOP:
            time.sleep(5)
            os.kill(victim, signal.SIGCONT)
        _, err = proc.communicate(timeout=900)
        ended = time.time()
        if target == "parent" and sig == signal.SIGKILL:
            while any(map(_alive, workers)) and time.time() - start < LEFT_AFTER_S:
                time.sleep(0.1)
            ended, cause = time.time(), f"parent killed; workers gone: {not any(map(_alive, workers))}"
        else:
            lines = err.strip().splitlines()
            cause = (lines[-1] if lines else f"exit {proc.returncode}")
            cause = f"stopped 5 s, continued: {cause or 'completed'}" if sig == signal.SIGSTOP else cause
        left = _left(workers)
        resumed = _resume_identity(tmp)
        return {"fault": f"{sig.name} sweep {target}", "time_to_end_s": ended - start, "cause": cause[:110],
                "left": left, "files_left": _files_left(tmp, []), "resume_identical": resumed}


def _wait_for_children(proc: subprocess.Popen, count: int, limit_s: float = 600) -> list[int]:
    end = time.monotonic() + limit_s
    while time.monotonic() < end and proc.poll() is None:
        kids = [k for k in _children(proc.pid) if b"resource_tracker" not in _cmdline(k)]
        if len(kids) >= count:
            return kids
        time.sleep(0.05)
    raise RuntimeError(f"the sweep did not start {count} workers in {limit_s:.0f} s")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _resume_identity(tmp: Path) -> bool:
    """Re-run the killed sweep into the same folder and a clean one: same files, same records
    (search_time_s, the measured search time, left out)."""
    for name in ("out", "clean"):
        subprocess.run([sys.executable, *COMPARE, "--workers", "2", "--out", str(tmp / name)], env=_env(tmp),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=900)
    a, b = tmp / "out", tmp / "clean"
    names = [sorted(str(p.relative_to(x)) for p in x.rglob("*")) for x in (a, b)]
    if names[0] != names[1]:
        print(f"  resume: files differ: {sorted(set(names[0]) ^ set(names[1]))[:4]}", file=sys.stderr)
        return False
    plans = all((a / "plans" / p.name).read_bytes() == p.read_bytes() for p in (b / "plans").glob("*"))
    strip = lambda path: [{k: v for k, v in r.items() if k != "search_time_s"}  # noqa: E731
                          for r in json.loads(path.read_text())]
    return plans and strip(a / "results.json") == strip(b / "results.json")


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'fault':24s} {'end s':>6s} {'left':>4s} {'files left':>10s} {'resume':>6s}  cause"
    lines = [head]
    for r in rows:
        t = "-" if r["time_to_end_s"] is None else f"{r['time_to_end_s']:.1f}"
        resume = {True: "same", False: "DIFF", None: ""}[r.get("resume_identical")]
        lines.append(f"{r['fault']:24s} {t:>6s} {r['left']:4d} {len(r['files_left']):10d} {resume:>6s}  {r['cause']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m benchmarks.faults", description=__doc__)
    p.add_argument("--only", nargs="+", choices=("ranks", "launcher", "sweep"), default=["ranks", "launcher", "sweep"])
    args = p.parse_args(argv)
    rows = []
    if "ranks" in args.only:
        rows += [rank_fault(v, s) for s in (signal.SIGKILL, signal.SIGSTOP) for v in range(WORLD)]
    if "launcher" in args.only:
        rows += [launcher_fault(s) for s in (signal.SIGKILL, signal.SIGSTOP)]
    if "sweep" in args.only:
        rows += [sweep_fault(t, s) for t in ("parent", "worker") for s in (signal.SIGKILL, signal.SIGSTOP)]
    print(table(rows), flush=True)
    bad = [r for r in rows if r["left"] or r["files_left"] or r.get("resume_identical") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
