"""Child processes that die with their parent: the executor's ranks and the sweeps' pool workers
share this one mechanism (Linux parent-death signal, plus a watchdog thread where that is missing)."""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Iterator

WATCH_S = 1.0
"""How often the watchdog looks at the parent: a child outlives it by at most this."""


def die_with_parent(parent_pid: int) -> None:
    """From inside a child: be SIGKILLed when ``parent_pid`` dies. prctl(PR_SET_PDEATHSIG) acts
    at once where Linux has it; a daemon thread polls the parent everywhere (and covers a
    parent that died before the call)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if not _alive(parent_pid):
        os._exit(1)

    def watch() -> None:
        while _alive(parent_pid):
            time.sleep(WATCH_S)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def _alive(pid: int) -> bool:
    """``pid`` is still our parent (a dead parent's children are re-parented, so getppid changes)."""
    return os.getppid() == pid


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A local process pool whose workers die with this process (a SIGKILLed sweep leaves none)."""
    return ProcessPoolExecutor(max_workers=workers, initializer=die_with_parent, initargs=(os.getpid(),))


class WorkerDied(RuntimeError):
    """A pool worker died (killed, out of memory) before returning its result."""


def completed(futures: dict[Future, Any]) -> Iterator[tuple[Any, Any]]:
    """(futures[f], f.result()) as each future completes; a dead worker is one WorkerDied line
    (not BrokenProcessPool's traceback)."""
    try:
        for future in as_completed(futures):
            yield futures[future], future.result()
    except BrokenProcessPool:
        raise WorkerDied("a pool worker died before returning its cell (killed, or out of memory); "
                         "the cells finished before it are kept") from None
