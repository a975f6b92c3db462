"""A simulated GPU: streams that run work one item at a time, and memory that can run out."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Generator

import simpy

from specs.units import GIB


class Channel(StrEnum):
    """A GPU's streams: each runs one item at a time (the value names it in traces)."""

    COMPUTE = "compute"
    """Kernels of the layers, embedding, head and optimizer step."""
    TP = "tp"
    """Tensor-parallel collectives (on the critical path)."""
    DP = "dp"
    """Gradient synchronisation (overlapped with backward)."""
    GATHER = "gather"
    """ZeRO-3 parameter all-gathers (their own stream, as FSDP has)."""
    P2P = "p2p"
    """Pipeline sends between stages."""
    CP = "cp"
    """Context parallelism's K/V ring sends or all-gathers (overlapped with the attention core)."""


@dataclass(frozen=True, kw_only=True)
class OOMEvent:
    """The first allocation that did not fit on a GPU."""

    time_s: float
    """Simulated time of the allocation."""
    gpu: int
    """Rank of the GPU."""
    what: str
    """What was being allocated (e.g. ``act L3 mb1``)."""
    requested_bytes: float
    live_bytes: float
    """Bytes already allocated when the request came."""
    capacity_bytes: float

    def __str__(self) -> str:
        return (f"out of memory on GPU {self.gpu} at t={self.time_s:.6f}s allocating {self.what}: "
                f"{self.requested_bytes / GIB:.2f} GiB requested, {self.live_bytes / GIB:.2f} GiB live, "
                f"capacity {self.capacity_bytes / GIB:.2f} GiB")


class Recorder:
    """Intervals of work on named tracks: (pid, track, name, start_s, end_s)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.spans: list[tuple[str, str, str, float, float]] = []

    def span(self, pid: str, track: str, name: str, start_s: float, end_s: float) -> None:
        if self.enabled:
            self.spans.append((pid, track, name, start_s, end_s))


Work = float | Callable[[], Generator]
"""A duration in seconds, or a function returning a SimPy generator to run."""


class Contention:
    """Compute and data-parallel communication on one GPU slowing each other (Galvatron's
    overlap coefficient gamma > 1: both kinds of kernels want the same SMs and memory). While
    both run, compute goes at 1/gamma of its speed and so do the GPU's own links
    (``scale_links``), so B seconds of compute beside C of communication take
    max(B, C) + (gamma - 1) min(B, C), the cost models' overlap formula. A transfer held back
    by a shared link (a NIC, a PCIe uplink) below its port's slowed rate is not slowed more."""

    def __init__(self, env: simpy.Environment, gamma: float, scale_links: Callable[[float], None]) -> None:
        if gamma <= 1.0:
            raise ValueError(f"overlap coefficient must be > 1 for contention, got {gamma}")
        self.env, self.gamma, self.scale_links = env, gamma, scale_links
        self.computing = False
        self.comm_running = 0
        self._changed = env.event()

    def comm(self, started: bool) -> None:
        """A data-parallel item started (True) or ended on this GPU."""
        was = self.comm_running > 0
        self.comm_running += 1 if started else -1
        if (self.comm_running > 0) != was:
            self._scale_links()
            changed, self._changed = self._changed, self.env.event()
            changed.succeed()  # a compute in progress changes speed

    def compute(self, seconds: float):
        """Generator: ``seconds`` of compute, at 1/gamma speed while communication runs."""
        self.computing = True
        self._scale_links()
        left = seconds
        while True:
            rate = 1.0 / self.gamma if self.comm_running else 1.0
            start, done = self.env.now, self.env.timeout(left / rate)
            yield done | self._changed
            if done.processed:
                break
            left -= (self.env.now - start) * rate
        self.computing = False
        self._scale_links()

    def _scale_links(self) -> None:
        self.scale_links(1.0 / self.gamma if self.computing and self.comm_running else 1.0)


class Stream:
    """A CUDA stream or a communication channel: jobs run in the order they were put.

    ``pace``: how a duration of work passes (a generator function; default: a timeout), e.g.
    Contention.compute; ``on_item``: told True / False as each queued item starts and ends."""

    def __init__(self, env: simpy.Environment, name: str, gpu: int, recorder: Recorder | None = None,
                 pace: Callable[[float], Generator] | None = None,
                 on_item: Callable[[bool], None] | None = None) -> None:
        self.env = env
        self.name = name
        self.gpu = gpu
        self.recorder = recorder
        self.busy_s = 0.0
        self.intervals: list[tuple[float, float]] = []
        self.pace = pace or self._timeout
        self.on_item = on_item
        self._queue = simpy.Store(env)
        self.action = env.process(self._run())

    def put(self, name: str, work: Work) -> simpy.Event:
        """Queue ``work``; the returned event fires when it is done."""
        done = self.env.event()
        self._queue.put((name, work, done))
        return done

    def run(self, name: str, work: Work):
        """Generator: run ``work`` now inside the caller's process. Only for a stream that one
        process drives in sequence (compute, TP, pipeline sends): it skips the queue's events."""
        start = self.env.now
        if callable(work):
            yield from work()
        elif work > 0:
            yield from self.pace(work)
        self._record(name, start)

    def _timeout(self, seconds: float):
        yield self.env.timeout(seconds)

    def _run(self):
        while True:
            name, work, done = yield self._queue.get()
            if self.on_item is not None:
                self.on_item(True)
            yield from self.run(name, work)
            if self.on_item is not None:
                self.on_item(False)
            done.succeed(self.env.now)

    def _record(self, name: str, start: float) -> None:
        end = self.env.now
        if end > start:
            self.busy_s += end - start
            self.intervals.append((start, end))
            if self.recorder is not None:
                self.recorder.span(f"GPU {self.gpu}", self.name, name, start, end)


class Memory:
    """Bytes on one GPU: allocations go up and down; the first overflow is an OOMEvent.

    An overflowing allocation still happens (the rest of the iteration is played out so
    the report shows how far over it goes); ``oom`` holds the first one, the SimPy event
    ``out_of_memory`` fires with it (a process can wait for it), and so does ``on_oom``.
    """

    def __init__(self, env: simpy.Environment, gpu: int, capacity_bytes: float, record: bool = True,
                 on_oom: Callable[[OOMEvent], None] | None = None) -> None:
        self.env = env
        self.gpu = gpu
        self.capacity_bytes = float(capacity_bytes)
        self.record = record
        self.on_oom = on_oom
        self.level_bytes = 0.0
        self.peak_bytes = 0.0
        self.oom: OOMEvent | None = None
        self.out_of_memory = env.event()
        self.timeline: list[tuple[float, float]] = [(0.0, 0.0)] if record else []

    def alloc(self, what: str, nbytes: float) -> None:
        if nbytes <= 0:
            return
        if self.oom is None and self.level_bytes + nbytes > self.capacity_bytes:
            self.oom = OOMEvent(time_s=self.env.now, gpu=self.gpu, what=what, requested_bytes=float(nbytes),
                                live_bytes=self.level_bytes, capacity_bytes=self.capacity_bytes)
            self.out_of_memory.succeed(self.oom)
            if self.on_oom is not None:
                self.on_oom(self.oom)
        self._set(self.level_bytes + nbytes)

    def free(self, what: str, nbytes: float) -> None:
        if nbytes <= 0:
            return
        if nbytes > self.level_bytes * (1 + 1e-9) + 1:
            raise RuntimeError(f"GPU {self.gpu}: freeing {what} ({nbytes:.0f} B) with only "
                               f"{self.level_bytes:.0f} B live")
        self._set(max(0.0, self.level_bytes - nbytes))

    def _set(self, level: float) -> None:
        self.level_bytes = level
        self.peak_bytes = max(self.peak_bytes, level)
        if self.record:
            if self.timeline and self.timeline[-1][0] == self.env.now:
                self.timeline[-1] = (self.env.now, level)
            else:
                self.timeline.append((self.env.now, level))


class GPU:
    """One accelerator: a compute stream, communication channels, and its memory."""

    CHANNELS = (Channel.TP, Channel.DP, Channel.GATHER, Channel.P2P, Channel.CP)
    """The communication streams, beside the compute stream (see Channel)."""

    CONTENDING = (Channel.DP, Channel.GATHER)
    """The channels whose work slows compute down under a Contention (data-parallel traffic,
    which overlaps compute; TP collectives and sends sit between compute on its path, and under TP
    communication overlap run beside GEMM chunks without slowing them, as the cost models charge)."""

    def __init__(self, env: simpy.Environment, rank: int, capacity_bytes: float, recorder: Recorder | None = None,
                 record_memory: bool = True, on_oom: Callable[[OOMEvent], None] | None = None,
                 contention: Contention | None = None) -> None:
        self.rank = rank
        pace = contention.compute if contention is not None else None
        self.compute = Stream(env, Channel.COMPUTE, rank, recorder, pace=pace)
        self.channels = {name: Stream(env, name, rank, recorder,
                                      on_item=contention.comm if contention and name in self.CONTENDING else None)
                         for name in self.CHANNELS}
        self.memory = Memory(env, rank, capacity_bytes, record_memory, on_oom)

    def comm_intervals(self) -> list[tuple[float, float]]:
        return sorted(iv for ch in self.channels.values() for iv in ch.intervals)


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total time covered by sorted (start, end) intervals."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in intervals:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total
