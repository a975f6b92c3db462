"""Run a function on N local processes (fork, gloo on 127.0.0.1) and collect what each returns.

A rank that raises, dies or outlives the timeout ends the whole run with a LaunchError that
names the rank; the other ranks are killed, so nothing hangs forever.
"""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import sys
import os
import pickle
import signal
import socket
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any, Callable

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"


class LaunchError(RuntimeError):
    """A rank failed, died or hung; the message names it."""

    def __init__(self, rank: int | None, message: str) -> None:
        self.rank = rank
        super().__init__(message if rank is None else f"rank {rank}: {message}")


def launch(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 300.0,
           threads_per_rank: int = 1, backend: str = "gloo") -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` forked processes; their results by rank.

    With backend="nccl" rank r uses GPU r; the parent must not have touched CUDA (fork).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    # The parent only opens the listening socket; rank 0 serves the store on it. A store
    # server thread in the parent could hold a lock at fork time and hang a child.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    ctx = mp.get_context("fork")
    procs, conns = [], []
    for rank in range(world_size):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, world_size, port, listener.fileno(), timeout_s,
                                             threads_per_rank, backend, send, args), daemon=True)
        p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    try:
        return _collect(procs, conns, timeout_s)
    finally:
        _kill_all(procs)
        listener.close()


def _collect(procs: list, conns: list, timeout_s: float) -> list[Any]:
    """Wait for every rank's result; raise on the first failure, death or the deadline."""
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    pending = {c: r for r, c in enumerate(conns)}
    sentinels = {p.sentinel: r for r, p in enumerate(procs)}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            ranks = sorted(pending.values())
            raise LaunchError(ranks[0], f"timed out after {timeout_s:.0f} s (ranks {ranks} unfinished)")
        ready = wait(list(pending) + [s for s, r in sentinels.items() if r in pending.values()], left)
        for obj in ready:
            if obj in pending:
                rank = pending.pop(obj)
                try:
                    status, payload = pickle.loads(obj.recv_bytes())
                except EOFError:
                    procs[rank].join(timeout=2)  # to read its exit code
                    raise LaunchError(rank, f"died (exit code {procs[rank].exitcode})") from None
                if status == "error":
                    raise LaunchError(rank, payload)
                results[rank] = payload
            elif sentinels.get(obj) in pending.values():
                rank = sentinels[obj]
                conn = next(c for c, r in pending.items() if r == rank)
                if not conn.poll():  # exited without a result
                    raise LaunchError(rank, f"died (exit code {procs[rank].exitcode})")
    return [results[r] for r in range(len(procs))]


def _kill_all(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join(timeout=5)


def _child(fn: Callable, rank: int, world_size: int, port: int, listen_fd: int, timeout_s: float,
           threads: int, backend: str, conn: Any, args: tuple) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    # a rank about to be killed for hanging first prints where it is stuck
    faulthandler.dump_traceback_later(max(1.0, timeout_s - 2.0), file=sys.stderr)
    torch.set_num_threads(threads)
    try:
        master = rank == 0
        store = dist.TCPStore(LOOPBACK, port, world_size, is_master=master, wait_for_workers=False,
                              master_listen_fd=listen_fd if master else None,
                              timeout=timedelta(seconds=timeout_s))
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, rank=rank, world_size=world_size, store=store,
                                timeout=timedelta(seconds=timeout_s))
        result = fn(rank, world_size, *args)
        # plain pickle: the default reducers would pass tensors through shared memory,
        # which breaks once this process exits
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException as err:  # report anything, including KeyboardInterrupt, to the parent
        last = traceback.format_exc().strip().splitlines()
        where = last[-3].strip() if len(last) > 2 else ""
        conn.send_bytes(pickle.dumps(("error", f"{type(err).__name__}: {err} [{where}]")))
    finally:
        conn.close()
        # skip atexit handlers inherited from the parent (and gloo teardown, which can block)
        os._exit(0)
