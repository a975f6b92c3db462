"""The local launcher under real faults: a failing, dead (SIGKILL), stopped (SIGSTOP) or hung rank
ends the run naming that rank; killing the launcher takes its ranks with it; no orphan remains."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from executor.launch import LaunchError, launch, progress

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    """Live (non-zombie) descendants of ``pid``, from /proc."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if _alive(k) and k not in out and not _is_resource_tracker(k):
                    out.add(k)
                    todo.append(k)
    return out


def _is_resource_tracker(pid: int) -> bool:
    """multiprocessing's helper, started once per process by spawn; it lives as long as pytest."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(autouse=True)
def no_orphans():
    """Every test: no process it started outlives it by more than a few seconds."""
    before = _children(os.getpid())
    yield
    end = time.monotonic() + 5
    while (left := _children(os.getpid()) - before) and time.monotonic() < end:
        time.sleep(0.1)
    assert not left, f"orphans left: {sorted(left)}"


def _sum_ranks(rank, world):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return rank, float(t)


def _fail_on_one(rank, world):
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # the others wait forever for rank 1: the launcher must still end the run
    return rank


def _signal_self(rank, world, victim, sig):
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), sig)
    dist.barrier()  # the others block here on the victim
    return rank


def _hang_on_one(rank, world):
    if rank == 1:
        time.sleep(600)  # alive and beating, but never reaching the barrier
    dist.barrier()
    return rank


def _die_on_one(rank, world):
    if rank == 1:
        os._exit(3)
    time.sleep(60)


def _steps_then_fail(rank, world):
    for step in range(3):
        progress({"step": step, "loss": 1.0 / (step + 1)})
    dist.barrier()  # every rank has sent its steps before rank 0 fails (else a slow rank 1 may not have)
    if rank == 0:
        raise RuntimeError("step 3 failed")
    dist.barrier()


def test_results_come_back_by_rank_twice():
    # twice in a row: rank 0 serves the store and must not leave before the others are done
    for _ in range(2):
        assert launch(_sum_ranks, 3, timeout_s=60) == [(0, 3.0), (1, 3.0), (2, 3.0)]


def test_a_raising_rank_is_named():
    with pytest.raises(LaunchError, match=r"rank 1: ValueError: boom on purpose \[at test_launch.py:\d+ in _fail_on_one\]") as err:
        launch(_fail_on_one, 2, timeout_s=60)
    assert err.value.rank == 1
    assert "waiting in torch.distributed.barrier" in err.value.where[0]


@pytest.mark.parametrize("victim", [2, 0])
def test_sigkill_of_a_rank_names_it(victim):
    with pytest.raises(LaunchError, match=f"rank {victim}: died \\(killed by SIGKILL\\)") as err:
        launch(_signal_self, 3, victim, signal.SIGKILL, timeout_s=60)
    assert err.value.rank == victim


def test_sigstop_of_a_middle_rank_is_named_by_its_heartbeat():
    with pytest.raises(LaunchError, match="rank 1: no heartbeat") as err:
        launch(_signal_self, 3, 1, signal.SIGSTOP, timeout_s=120, heartbeat_timeout_s=3)
    assert err.value.rank == 1
    lines = str(err.value).splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["rank 0", "rank 1", "rank 2"]
    assert "waiting in torch.distributed.barrier" in err.value.where[0]
    assert "waiting in torch.distributed.barrier" in err.value.where[2]


def test_a_hung_rank_is_named_at_the_timeout_with_where_it_was():
    with pytest.raises(LaunchError, match=r"rank 1: timed out after 8 s at test_launch.py:\d+ in _hang_on_one") as err:
        launch(_hang_on_one, 3, timeout_s=8)
    assert "waiting in torch.distributed.barrier" in err.value.where[2]


def test_a_dead_rank_is_named():
    with pytest.raises(LaunchError, match=r"rank 1: died \(exit code 3\)"):
        launch(_die_on_one, 2, timeout_s=30)


def test_completed_steps_are_written_as_they_complete(tmp_path):
    path = tmp_path / "progress.jsonl"
    with pytest.raises(LaunchError, match="rank 0: RuntimeError: step 3 failed"):
        launch(_steps_then_fail, 2, timeout_s=60, progress_path=path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted((r["rank"], r["step"]) for r in rows) == [(r, s) for r in (0, 1) for s in range(3)]


@pytest.mark.parametrize("bad", [dict(timeout_s=float("nan")), dict(timeout_s=-1), dict(heartbeat_timeout_s=0)])
def test_bad_limits_are_refused_up_front(bad):
    with pytest.raises(ValueError, match="must be a finite number of seconds > 0"):
        launch(_sum_ranks, 2, **bad)


LAUNCHER = textwrap.dedent("""
    import os, sys, time
    from executor.launch import launch
    from tests.executor.test_launch import _write_pid_and_wait
    launch(_write_pid_and_wait, 3, sys.argv[1], timeout_s=300)
""")


def _write_pid_and_wait(rank, world, folder):
    Path(folder, f"{rank}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def test_ranks_die_with_a_killed_launcher(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], env=env, cwd=REPO)
    try:
        end = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 3 and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
        assert len(pids) == 3, "the ranks never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        end = time.monotonic() + 5
        while any(map(_alive, pids)) and time.monotonic() < end:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "ranks outlived their launcher"
    finally:
        proc.kill()
        proc.wait()


def test_the_heartbeat_keeps_no_local_of_the_main_thread_alive():
    """A beat reads where the main thread is; a frame it kept would keep that function's
    locals (tensors) alive after the function returned, and a rank's peak memory would depend
    on when the beat came."""
    import threading
    import weakref

    from executor import launch as launch_module

    class Beats:
        def __init__(self) -> None:
            self.where: list[str] = []

        def send(self, message: tuple) -> None:
            self.where.append(message[1])

    beats, stop = Beats(), threading.Event()
    held: list[weakref.ref] = []

    def holds_a_tensor() -> None:
        t = torch.ones(4)
        held.append(weakref.ref(t))
        while not any("holds_a_tensor" in w for w in beats.where):  # until a beat has looked here
            time.sleep(0.01)

    thread = threading.Thread(target=launch_module._heartbeat, args=(beats, stop), daemon=True)
    thread.start()
    holds_a_tensor()
    alive = held[0]() is not None  # the heartbeat now waits BEAT_S before its next look
    stop.set()
    thread.join()
    assert not alive


def _affinity(rank: int, world_size: int) -> list[int]:
    return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_cpu_ranks_get_a_core_each_when_there_are_enough():
    cores = launch(_affinity, 2, timeout_s=300)
    assert [len(c) for c in cores] == [1, 1] and cores[0] != cores[1]


def test_one_rank_and_oversubscribed_ranks_are_left_to_the_scheduler():
    cores = len(os.sched_getaffinity(0))
    for world in (1, cores + 1):
        assert all(len(c) == cores for c in launch(_affinity, world, timeout_s=300))


def _page_faults_of_repeated_steps(rank: int, world_size: int) -> list[int]:
    """Minor page faults of each of eight "steps", each allocating 40, 28 and 40 MiB tensors
    (the first two alive together) and freeing them."""
    import resource
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for first, second in ((10 << 20, 7 << 20), (10 << 20, 0)):
            a, b = torch.empty(first), torch.empty(second)
            a.fill_(1.0), b.fill_(1.0)
            del a, b
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_cpu_ranks_reuse_freed_memory_without_page_faults():
    """Freed blocks are the next steps' tensors, as on a GPU's caching allocator: not unmapped
    and zero-filled by the kernel again in every step (27k faults a step here before). glibc
    reuses them once its free blocks have merged (posix_memalign asks a little more than the
    block it returns): within a few steps."""
    for faults in launch(_page_faults_of_repeated_steps, 2, timeout_s=300):
        assert faults[0] > 10_000  # the first step takes its pages from the kernel
        assert max(faults[-3:]) < 0.01 * faults[0], faults


def _launch_folders() -> set[str]:
    import tempfile
    return {p.name for p in Path(tempfile.gettempdir()).glob("hybridpar-launch-*")}


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """A temp dir of this test's own (other runs on the machine make folders in /tmp too)."""
    import tempfile
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


def test_the_launchers_own_write_error_is_reported_as_its_own():
    """It used to be swallowed with the pipe's errors: 'rank 0: died (exit code 0)'."""
    with pytest.raises(LaunchError, match=r"^launcher: cannot write the progress file /dev/full: No space") as err:
        launch(_steps_then_fail, 2, timeout_s=60, progress_path="/dev/full")
    assert err.value.rank is None


def test_a_failed_run_leaves_no_folder_unless_asked(tmp_path, own_tmp):
    before = _launch_folders()
    assert before == set()
    with pytest.raises(LaunchError) as err:
        launch(_fail_on_one, 2, timeout_s=60)
    assert _launch_folders() == before and "full stacks" not in str(err.value)
    with pytest.raises(LaunchError, match=f"full stacks: {tmp_path / 'stacks'}"):  # live ranks dump theirs
        launch(_hang_on_one, 2, timeout_s=5, stacks_dir=tmp_path / "stacks")
    assert _launch_folders() == before
    assert any(p.stat().st_size for p in (tmp_path / "stacks").glob("rank*.txt"))


def test_the_next_launch_removes_the_folder_of_a_killed_launcher(own_tmp):
    import tempfile
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = Path(tempfile.gettempdir()) / f"hybridpar-launch-{int(dead.stdout)}-x1"
    orphan.mkdir()
    (orphan / "rank0.txt").write_text("stacks")
    live = Path(tempfile.gettempdir()) / f"hybridpar-launch-{os.getpid()}-x2"
    live.mkdir()
    assert launch(_sum_ranks, 2, timeout_s=60) == [(0, 1.0), (1, 1.0)]
    assert not orphan.exists() and live.exists()  # a running launcher's folder is its own
