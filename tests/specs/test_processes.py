"""Pool workers die with their parent (the executor's ranks' mechanism, shared), and a dead worker
is one line, not BrokenProcessPool's traceback."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specs.processes import WorkerDied, completed, worker_pool

REPO = Path(__file__).resolve().parents[2]
PARENT = """
import os, sys, time
from specs.processes import worker_pool
pool = worker_pool(2)
futures = [pool.submit(time.sleep, 60) for _ in range(2)]
time.sleep(1.0)
print(" ".join(str(p) for p in pool._processes), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_workers_die_with_a_sigkilled_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(map(_alive, workers))
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    end = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(map(_alive, workers))  # they outlived the parent by 30 s and more before


def _suicide(_: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_worker_is_one_line():
    with worker_pool(1) as pool, pytest.raises(WorkerDied, match="a pool worker died"):
        list(completed({pool.submit(_suicide, 0): 0}))
