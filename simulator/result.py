"""SimResult: what one simulated iteration tells (time, memory, busy fractions, links, OOM)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.hardware import OOMEvent
from specs.units import GIB


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """One simulated training iteration of a plan."""

    iteration_time_s: float
    """From the first op to the last optimizer step (and ZeRO-1/2 parameter gather)."""
    throughput_samples_per_s: float
    peak_memory_bytes: tuple[float, ...]
    """Peak allocated bytes of each GPU (rank order)."""
    capacity_bytes: float
    """Memory of one GPU."""
    oom: OOMEvent | None
    """The first allocation that did not fit (earliest in time over all GPUs), or None."""
    bubble_fraction: float
    """Mean over GPUs of the share of the iteration not spent on per-micro-batch work
    (compute, TP collectives, pipeline sends); the optimizer tail counts as bubble, as in
    the cost model's bubble_fraction."""
    compute_busy_fraction: float
    """Mean over GPUs of compute-stream busy time / iteration time."""
    comm_busy_fraction: float
    """Mean over GPUs of the time any communication channel is busy / iteration time."""
    link_utilisation: dict[str, float]
    """Bytes a link resource carried / (its capacity * iteration time), by resource name."""
    memory_timeline: tuple[tuple[tuple[float, float], ...], ...]
    """Per GPU: (time_s, live bytes) at each change (empty if not recorded)."""
    events: int
    """SimPy events processed."""
    simulated_gpus: int
    """GPUs played out (the world size, or one per stage with the symmetry shortcut)."""
    stage_end_s: tuple[float, ...] = ()
    """When each stage finished its iteration."""
    spans: tuple[tuple[str, str, str, float, float], ...] = field(default=(), repr=False)
    """(gpu, stream, name, start_s, end_s) of every piece of work, when kept."""

    @property
    def peak_memory_gib(self) -> float:
        """Largest peak over all GPUs, GiB."""
        return max(self.peak_memory_bytes) / GIB

    @property
    def fits(self) -> bool:
        return self.oom is None

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready summary (what ``python -m simulator.run --json`` prints)."""
        return {
            "iteration_time_s": self.iteration_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "peak_memory_gib": self.peak_memory_gib,
            "peak_memory_gib_per_gpu": [b / GIB for b in self.peak_memory_bytes],
            "capacity_gib": self.capacity_bytes / GIB,
            "oom": None if self.oom is None else {
                "time_s": self.oom.time_s, "gpu": self.oom.gpu, "what": self.oom.what,
                "requested_bytes": self.oom.requested_bytes, "live_bytes": self.oom.live_bytes,
                "capacity_bytes": self.oom.capacity_bytes, "message": str(self.oom)},
            "bubble_fraction": self.bubble_fraction,
            "compute_busy_fraction": self.compute_busy_fraction,
            "comm_busy_fraction": self.comm_busy_fraction,
            "link_utilisation": self.link_utilisation,
            "events": self.events,
            "simulated_gpus": self.simulated_gpus,
        }

    def summary(self) -> str:
        """A few human-readable lines."""
        busiest = sorted(self.link_utilisation.items(), key=lambda kv: -kv[1])[:3]
        links = ", ".join(f"{k} {v:.0%}" for k, v in busiest) or "none"
        lines = [
            f"iteration time   {self.iteration_time_s * 1e3:.2f} ms "
            f"({self.throughput_samples_per_s:.2f} samples/s)",
            f"peak memory      {self.peak_memory_gib:.2f} GiB of {self.capacity_bytes / GIB:.0f} GiB per GPU",
            f"busy             compute {self.compute_busy_fraction:.1%}, comm {self.comm_busy_fraction:.1%}"
            + (f", bubble {self.bubble_fraction:.1%}" if len(self.stage_end_s) > 1 else ""),  # pipelines only
            f"busiest links    {links}",
            f"events           {self.events} ({self.simulated_gpus} GPUs played out)",
        ]
        lines.append(f"OOM              {self.oom}" if self.oom else "OOM              none")
        return "\n".join(lines)
