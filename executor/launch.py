"""Run a function on N local processes (spawned, gloo on 127.0.0.1) and collect what each returns.

A rank that raises, dies, stops sending heartbeats or outlives the timeout ends the whole run with
a LaunchError naming the rank that caused it and one line per rank of where it was (full stacks go
to a file). Ranks die with their launcher (parent-death signal plus a watchdog on the parent).
"""
from __future__ import annotations

import faulthandler
import json
import math
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

from specs.processes import die_with_parent

LOOPBACK = "127.0.0.1"
BEAT_S = 0.5
"""Seconds between two heartbeats of a rank (each carries where its main thread is)."""
GRACE_S = 1.0
"""After the first failure, how long to keep listening: a rank killed first and the ranks whose
collectives then fail report within this, and the root cause is named, not the first reporter."""
_CHANNEL: "_Channel | None" = None


class LaunchError(RuntimeError):
    """A rank failed, died or hung; the message names it, then where every rank was."""

    def __init__(self, rank: int | None, message: str, where: dict[int, str] | None = None) -> None:
        self.rank = rank
        self.where = dict(where or {})
        head = message if rank is None else f"rank {rank}: {message}"
        lines = [head] + [f"  rank {r}: {w}" for r, w in sorted(self.where.items())]
        super().__init__("\n".join(lines))


def launch(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 300.0,
           threads_per_rank: int = 1, backend: str = "gloo", heartbeat_timeout_s: float = 30.0,
           progress_path: str | Path | None = None, start_timeout_s: float = 600.0,
           stacks_dir: str | Path | None = None) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; their results by rank.

    ``fn`` and ``args`` must pickle (module-level functions). With backend="nccl" rank r uses
    GPU r; the parent never touches CUDA. Each rank imports torch afresh (spawn), which may take
    a while on a busy host (over 180 s seen at load 16 on 2 cores): ``start_timeout_s`` bounds
    that (a rank that dies meanwhile is named at once), and ``timeout_s`` counts from when
    every rank has started. A rank silent for ``heartbeat_timeout_s`` (stopped,
    or stuck holding the GIL) is named at once; records a rank passes to ``progress()`` are
    appended to ``progress_path`` (JSON lines) as they arrive; a launcher that cannot write
    there ends the run with its own LaunchError. The ranks' full stacks at a failure go to a
    temporary folder that is always removed, after a copy to ``stacks_dir`` when given.
    """
    _check_args(world_size, timeout_s, heartbeat_timeout_s, start_timeout_s)
    # The parent only opens the listening socket; rank 0 serves the store on it.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen(128)
    ctx = mp.get_context("spawn")
    _remove_orphaned_dump_dirs()
    dump_dir = Path(tempfile.mkdtemp(prefix=f"hybridpar-launch-{os.getpid()}-"))
    procs, conns = [], []
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            setup = _Setup(rank=rank, world_size=world_size, port=listener.getsockname()[1],
                           timeout_s=timeout_s, threads=threads_per_rank, backend=backend,
                           parent_pid=os.getpid(), dump_path=str(dump_dir / f"rank{rank}.txt"))
            p = ctx.Process(target=_child, args=(fn, setup, listener if rank == 0 else None, send, args),
                            daemon=True, name=f"rank{rank}")
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
        monitor = _Monitor(procs, conns, timeout_s, heartbeat_timeout_s, progress_path, dump_dir, start_timeout_s,
                           stacks_dir)
        return monitor.run()
    finally:
        _kill_all(procs)
        listener.close()
        _keep_and_remove(dump_dir, stacks_dir)


def progress(record: dict[str, Any]) -> None:
    """From inside a rank: send ``record`` (JSON-able) to the launcher now (a finished step)."""
    if _CHANNEL is not None:
        _CHANNEL.send(("progress", record))


def _check_args(world_size: Any, timeout_s: Any, heartbeat_timeout_s: Any, start_timeout_s: Any) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= 1024:
        raise ValueError(f"world_size must be an integer in [1, 1024], got {world_size!r}")
    for name, value in (("timeout_s", timeout_s), ("heartbeat_timeout_s", heartbeat_timeout_s),
                        ("start_timeout_s", start_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


class _Setup:
    """What a rank needs to start (a plain object: it crosses the spawn boundary by pickle)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class _Monitor:
    """The launcher's side: results, heartbeats, deaths, the deadline, and the root cause."""

    def __init__(self, procs: list, conns: list, timeout_s: float, heartbeat_timeout_s: float,
                 progress_path: str | Path | None, dump_dir: Path, start_timeout_s: float,
                 stacks_dir: str | Path | None = None) -> None:
        self.procs, self.conns = procs, conns
        self.timeout_s, self.heartbeat_timeout_s = timeout_s, heartbeat_timeout_s
        self.start_timeout_s = start_timeout_s
        self.progress_path = Path(progress_path) if progress_path else None
        self.dump_dir = dump_dir
        self.stacks_dir = stacks_dir
        self.results: dict[int, Any] = {}
        self.where: dict[int, str] = {r: "starting" for r in range(len(procs))}
        self.last_beat: dict[int, float] = {}
        self.failures: dict[int, tuple[int, str]] = {}  # rank -> (priority, message); lower = root cause
        self.open = set(range(len(procs)))

    def run(self) -> list[Any]:
        deadline = time.monotonic() + self.start_timeout_s  # until every rank has started
        started = False
        failed_at = None
        while len(self.results) < len(self.procs):
            now = time.monotonic()
            if failed_at is not None and now - failed_at > GRACE_S:
                break
            self._wait(min(BEAT_S, max(0.0, deadline - now)))
            if not started and len(self.last_beat) + len(self.results) == len(self.procs):
                started, deadline = True, time.monotonic() + self.timeout_s
            self._check_silence(time.monotonic())
            if time.monotonic() > deadline and not self.failures:
                self._timed_out() if started else self._never_started()
            if self.failures and failed_at is None:
                failed_at = time.monotonic()
        if self.failures:
            self._raise()
        return [self.results[r] for r in range(len(self.procs))]

    def _wait(self, timeout: float) -> None:
        watched = [self.conns[r] for r in self.open] + [p.sentinel for r, p in enumerate(self.procs)
                                                        if r not in self.results and r not in self.failures]
        for obj in wait(watched, timeout):
            if obj in self.conns:
                self._drain(self.conns.index(obj))
            else:
                rank = next(r for r, p in enumerate(self.procs) if p.sentinel == obj)
                self._drain(rank)
                if rank not in self.results:
                    self.procs[rank].join(timeout=1)
                    self._fail(rank, 0, _death(self.procs[rank].exitcode))

    def _drain(self, rank: int) -> None:
        conn = self.conns[rank]
        while rank in self.open:
            try:  # only the pipe's own errors mean the rank closed it; _handle's are the launcher's
                if not conn.poll():
                    return
                message = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                self.open.discard(rank)
                return
            self._handle(rank, message)

    def _handle(self, rank: int, message: tuple) -> None:
        kind = message[0]
        if kind == "beat":
            self.last_beat[rank], self.where[rank] = time.monotonic(), message[1]
        elif kind == "progress":
            self._append_progress(rank, message[1])
        elif kind == "ok":
            self.results[rank], self.where[rank] = message[1], "finished"
        elif kind == "error":
            text, distributed, self.where[rank] = message[1], message[2], message[3]
            # a collective that fails because a peer died is a symptom, not the cause
            self._fail(rank, 3 if distributed else 2, text)

    def _append_progress(self, rank: int, record: Any) -> None:
        if self.progress_path is not None:
            try:
                with open(self.progress_path, "a", encoding="utf-8") as out:
                    out.write(json.dumps({"rank": rank, **record}, default=str) + "\n")
                    out.flush()
            except OSError as err:
                raise LaunchError(None, f"launcher: cannot write the progress file {self.progress_path}: "
                                        f"{err.strerror or err}") from None

    def _check_silence(self, now: float) -> None:
        for rank, beat in self.last_beat.items():
            if rank in self.results or rank in self.failures:
                continue
            if now - beat > self.heartbeat_timeout_s:
                self._fail(rank, 1, f"no heartbeat for {now - beat:.0f} s (stopped, or stuck "
                           f"without releasing the GIL); last seen {self.where[rank]}")

    def _timed_out(self) -> None:
        unfinished = [r for r in range(len(self.procs)) if r not in self.results]
        # the rank not waiting in a collective is the one the others wait for
        culprits = [r for r in unfinished if "torch.distributed" not in self.where[r]] or unfinished
        self._fail(culprits[0], 1, f"timed out after {self.timeout_s:.0f} s {self.where[culprits[0]]} "
                   f"(ranks {unfinished} unfinished)")

    def _never_started(self) -> None:
        late = [r for r in range(len(self.procs)) if r not in self.last_beat and r not in self.results]
        self._fail(late[0], 1, f"not started after {self.start_timeout_s:.0f} s (ranks {late} never reported)")

    def _fail(self, rank: int, priority: int, message: str) -> None:
        if rank not in self.failures:
            self.failures[rank] = (priority, message)

    def _raise(self) -> None:
        _dump_stacks(self.procs, self.results)
        rank, (_, message) = min(self.failures.items(), key=lambda kv: (kv[1][0], kv[0]))
        where = dict(self.where)
        for r, (_, text) in self.failures.items():
            if r != rank:  # a symptom: where it was, then how it failed
                where[r] = f"{where[r]}; then {text[:120]}"
        dumps = sorted(self.dump_dir.glob("rank*.txt"))
        note = f" (full stacks: {self.stacks_dir})" if self.stacks_dir and any(p.stat().st_size for p in dumps) else ""
        raise LaunchError(rank, message + note, where)


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"died (killed by {signal.Signals(-exitcode).name})"
    return f"died (exit code {exitcode})"


def _dump_stacks(procs: list, results: dict) -> None:
    """Ask every live rank to write its full stacks (faulthandler on SIGUSR1), then give it a moment."""
    asked = False
    for rank, p in enumerate(procs):
        if rank not in results and p.is_alive():
            try:
                os.kill(p.pid, signal.SIGUSR1)
                asked = True
            except ProcessLookupError:
                pass
    if asked:
        time.sleep(0.3)


def _kill_all(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGKILL)  # works on a stopped process too
            except ProcessLookupError:
                pass
    for p in procs:
        p.join(timeout=5)


def _remove_orphaned_dump_dirs() -> None:
    """Remove the dump folders of launchers that were killed (SIGKILL leaves no time to clean up):
    their names carry the launcher's pid, and that pid is gone."""
    for folder in Path(tempfile.gettempdir()).glob("hybridpar-launch-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def _keep_and_remove(folder: Path, keep_in: str | Path | None) -> None:
    """Copy the non-empty stack dumps of ``folder`` to ``keep_in`` (when given), then remove it."""
    if keep_in is not None and any(p.stat().st_size for p in folder.glob("rank*.txt")):
        Path(keep_in).mkdir(parents=True, exist_ok=True)
        for path in folder.glob("rank*.txt"):
            shutil.copyfile(path, Path(keep_in) / path.name)
    shutil.rmtree(folder, ignore_errors=True)


# -- the rank's side ------------------------------------------------------------------------------------
class _Channel:
    """The rank's end of the result pipe; the heartbeat thread and the main thread share it."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.lock = conn, threading.Lock()

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message)  # plain pickle: no shared-memory tensors that die with us
        with self.lock:
            self.conn.send_bytes(data)


def _where(stack: traceback.StackSummary) -> str:
    """One line: where a stack is (the collective it waits in, and our innermost frame)."""
    dist = [f for f in stack if "torch/distributed" in f.filename]
    ours = [f for f in stack if "site-packages" not in f.filename and "/lib/python" not in f.filename]
    here = (ours or stack)[-1]
    text = f"{Path(here.filename).name}:{here.lineno} in {here.name}"
    return f"waiting in torch.distributed.{dist[-1].name} ({text})" if dist else f"at {text}"


def _main_thread_where(main_id: int) -> str:
    """Where the main thread is now. The frame is not kept past this call: a frame object
    that outlives its function keeps the function's locals (tensors) alive, which would make
    the rank's memory depend on when the beat came."""
    frame = sys._current_frames().get(main_id)
    return _where(traceback.extract_stack(frame)) if frame else "exiting"


def _heartbeat(channel: _Channel, stop: threading.Event) -> None:
    main_id = threading.main_thread().ident
    while not stop.is_set():  # the first beat at once: a rank may be stopped within BEAT_S
        try:
            channel.send(("beat", _main_thread_where(main_id)))
        except OSError:
            return
        stop.wait(BEAT_S)


def _child(fn: Callable, setup: _Setup, listener: socket.socket | None, conn: Any, args: tuple) -> None:
    global _CHANNEL
    die_with_parent(setup.parent_pid)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    dump = open(setup.dump_path, "w")
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    channel = _CHANNEL = _Channel(conn)
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(channel, stop), daemon=True, name="heartbeat").start()
    if setup.backend == "gloo":
        _pin_to_core(setup.rank, setup.world_size)
        keep_freed_memory()
    import torch
    import torch.distributed as dist
    torch.set_num_threads(setup.threads)
    store = None
    try:
        rank, world = setup.rank, setup.world_size
        store = dist.TCPStore(LOOPBACK, setup.port, world, is_master=rank == 0, wait_for_workers=False,
                              master_listen_fd=listener.fileno() if listener is not None else None,
                              timeout=timedelta(seconds=setup.timeout_s))
        device = None
        if setup.backend == "nccl":  # rank r on local GPU r, told to NCCL rather than guessed
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group(setup.backend, rank=rank, world_size=world, store=store,
                                timeout=timedelta(seconds=setup.timeout_s), device_id=device)
        result = fn(rank, world, *args)
        stop.set()
        channel.send(("ok", result))
        _leave_together(store, rank, world, setup.timeout_s)
    except BaseException as err:  # report anything, including KeyboardInterrupt, to the parent
        stop.set()
        stack = traceback.extract_tb(err.__traceback__)
        distributed = "Dist" in type(err).__name__ or "Connection" in str(err) or "Gloo" in str(err)
        try:
            channel.send(("error", f"{type(err).__name__}: {err} [{_where(stack)}]", distributed,
                          _where(stack)))
        except OSError:
            pass
    finally:
        conn.close()
        # skip atexit handlers and gloo teardown, which can block
        os._exit(0)


def _pin_to_core(rank: int, world: int) -> None:
    """Ranks of a CPU job on a core each when there is one per rank (threads a rank starts
    later, gloo's included, inherit it): no migrations, and no two ranks sharing a core while
    another idles, so a step's time does not depend on where the scheduler put the ranks. A
    single rank is left to the scheduler (several one-rank jobs would all land on one core)."""
    cores = sorted(os.sched_getaffinity(0))
    if 1 < world <= len(cores):
        os.sched_setaffinity(0, {cores[rank]})


MALLOC_OPTIONS = {-4: 0, -1: 2**31 - 1}
"""glibc mallopt: M_MMAP_MAX 0 (no block of its own mapping, which free() unmaps) and
M_TRIM_THRESHOLD 2 GiB (the heap's free top kept, not returned to the kernel)."""


def keep_freed_memory() -> None:
    """Freed memory stays with the process for its next tensors, as a GPU's caching allocator
    keeps it. glibc otherwise unmaps (or trims) large freed blocks, and the kernel zero-fills
    every page of the next one at first touch (2.2 us a 4 KiB page here, seven times writing
    it); whether a block is its own mapping follows glibc's dynamic threshold, set by the
    largest block freed so far, so the same operation ran at once or twice its time depending
    on what the process had allocated before: the executor's vocab-parallel cross-entropy
    23.9 or 11.5 ms, a MoE plan's Adam steps 41k faults a step (docs/executor.md). The profile's
    ranks and the plans' ranks both get it (on CPU), so each times what the other runs. A libc
    without mallopt is left as it is."""
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for option, value in MALLOC_OPTIONS.items():
        mallopt(option, value)


def _leave_together(store: Any, rank: int, world: int, timeout_s: float) -> None:
    """Rank 0 serves the store: it leaves only after every rank is done with it."""
    store.add("hybridpar/left", 1)
    if rank != 0:
        return
    end = time.monotonic() + timeout_s
    while store.add("hybridpar/left", 0) < world and time.monotonic() < end:
        time.sleep(0.01)
