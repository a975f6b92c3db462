"""Flow-level network: transfers share the link resources they cross, max-min fairly.

A flow carries bytes over a set of resources (ClusterSpec.path ids: GPU ports, PCIe uplinks,
NICs). Rates are recomputed, by water-filling, whenever a flow starts or ends; only the flows
connected to the change through shared resources are touched, which keeps large runs fast.
Flows are visited in the order they started (never in set order), so runs are reproducible.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Mapping

import simpy

GBYTE = 1e9
EPS_BYTES = 1e-6
"""Remaining bytes below this count as delivered (float round-off of rate * time)."""


@dataclass(eq=False)
class Flow:
    """``streams`` identical streams of ``nbytes`` each, moving at one common rate.

    A plain transfer is one stream. A bundle stands for several symmetric transfers that
    run in lockstep (the edges of a ring step, the same send on every data-parallel
    replica): ``weights[r]`` streams of the bundle cross resource r.
    """

    name: str
    nbytes: float
    weights: Mapping[Hashable, int]
    done: simpy.Event
    streams: int = 1
    remaining: float = 0.0
    rate: float = 0.0
    """Bytes/s of each stream."""
    updated_s: float = 0.0
    start_s: float = 0.0
    version: int = 0
    segments: list = field(default_factory=list)
    """(start_s, end_s, rate) pieces, kept only when the network records a trace."""
    seq: int = 0
    """Order of start in its network: the stable key every iteration over flows sorts by."""


class Network:
    """Link resources with capacities; ``put`` starts a flow and returns its done event."""

    def __init__(self, env: simpy.Environment, capacity_gbytes_per_s: Mapping[Hashable, float],
                 record: bool = False, on_flow_end: Callable[[Flow], None] | None = None) -> None:
        self.env = env
        self.base_capacity = {res: cap * GBYTE for res, cap in capacity_gbytes_per_s.items()}
        """Bytes/s of each resource as built; ``capacity`` is it times its current scale."""
        self.capacity = dict(self.base_capacity)
        self._scale: dict[Hashable, float] = {}
        self.record = record
        self.on_flow_end = on_flow_end
        self.carried_bytes: dict[Hashable, float] = {res: 0.0 for res in self.capacity}
        # insertion-ordered (dicts, not sets): a set of flows iterates in memory-address order
        self._flows_on: dict[Hashable, dict[Flow, None]] = {res: {} for res in self.capacity}
        self._seq = itertools.count()
        self.finished = 0

    def add_resource(self, res: Hashable, cap_gbytes_per_s: float) -> None:
        if res not in self.capacity:
            self.base_capacity[res] = cap_gbytes_per_s * GBYTE
            self.capacity[res] = self.base_capacity[res] * self._scale.get(res, 1.0)
            self.carried_bytes[res] = 0.0
            self._flows_on[res] = {}

    def scale(self, resources: Iterable[Hashable], factor: float) -> None:
        """Run ``resources`` at ``factor`` of their capacity from now on (also ones added later);
        the flows crossing them get new rates."""
        touched = []
        for res in resources:
            if self._scale.get(res, 1.0) == factor:
                continue
            self._scale[res] = factor
            if res in self.base_capacity:
                self.capacity[res] = self.base_capacity[res] * factor
                touched += [res] if self._flows_on[res] else []
        if touched:
            self._rebalance(self._component(touched))

    # -- public --------------------------------------------------------------------------
    def put(self, name: str, nbytes: float, weights: Mapping[Hashable, int], streams: int = 1) -> simpy.Event:
        """Start moving ``nbytes`` per stream over the resources in ``weights``."""
        done = self.env.event()
        flow = Flow(name=name, nbytes=nbytes, weights=dict(weights), done=done, streams=streams,
                    remaining=float(nbytes), updated_s=self.env.now, start_s=self.env.now,
                    seq=next(self._seq))
        if nbytes <= EPS_BYTES or not flow.weights:
            done.succeed(flow)
            return done
        shared = any(self._flows_on[res] for res in flow.weights)
        for res in flow.weights:
            self._flows_on[res][flow] = None
        if shared:
            self._rebalance(self._component(flow.weights))
        else:  # alone on its links: no other rate changes
            self._set_rate(flow, min(self.capacity[r] / w for r, w in flow.weights.items()))
        return done

    # -- internals -----------------------------------------------------------------------
    def _component(self, seeds) -> list[Flow]:
        """Flows linked to the resources ``seeds`` through chains of shared resources, by start order."""
        seen_res, flows, todo = set(), set(), list(seeds)
        while todo:
            res = todo.pop()
            if res in seen_res:
                continue
            seen_res.add(res)
            for f in self._flows_on[res]:
                if f not in flows:
                    flows.add(f)
                    todo.extend(r for r in f.weights if r not in seen_res)
        return sorted(flows, key=_start_order)

    def _settle(self, flow: Flow) -> None:
        """Account the bytes moved since the last rate change."""
        dt = self.env.now - flow.updated_s
        if dt > 0 and flow.rate > 0:
            moved = flow.rate * dt
            flow.remaining -= moved
            for res, w in flow.weights.items():
                self.carried_bytes[res] += moved * w
            if self.record:
                flow.segments.append((flow.updated_s, self.env.now, flow.rate))
        flow.updated_s = self.env.now

    def _rebalance(self, flows: list[Flow]) -> None:
        """Give ``flows`` their max-min fair rates and reschedule their completions."""
        if not flows:
            return
        for f in flows:
            self._settle(f)
        rates = water_fill(flows, self.capacity)
        for f in flows:
            if rates[f] != f.rate or not f.version:
                self._set_rate(f, rates[f])

    def _set_rate(self, flow: Flow, rate: float) -> None:
        """New rate from now on; the completion scheduled for the old one is ignored."""
        if not rate > 0:
            raise RuntimeError(f"flow {flow.name!r} got no bandwidth (rate {rate}); a link has zero capacity")
        flow.rate = rate
        flow.version += 1
        ev = self.env.timeout(max(flow.remaining, 0.0) / rate)
        ev.callbacks.append(self._finisher(flow, flow.version))

    def _finisher(self, flow: Flow, version: int):
        def finish(_event) -> None:
            if flow.version != version:
                return  # superseded by a later rate change
            self._settle(flow)
            flow.remaining = 0.0
            for res in flow.weights:
                self._flows_on[res].pop(flow, None)
            self.finished += 1
            if self.on_flow_end is not None:
                self.on_flow_end(flow)
            flow.done.succeed(flow)
            still_used = [res for res in flow.weights if self._flows_on[res]]
            if still_used:
                self._rebalance(self._component(still_used))
        return finish


def water_fill(flows, capacity: Mapping[Hashable, float]) -> dict:
    """Max-min fair rate per stream: raise all rates together, freeze flows at full links.

    A flow whose ``weights[r]`` streams cross resource r uses ``weights[r] * rate`` of it.
    """
    left = {}
    load: dict[Hashable, float] = {}
    for f in flows:
        for res, w in f.weights.items():
            left.setdefault(res, capacity[res])
            load[res] = load.get(res, 0.0) + w
    rates, active = {}, dict.fromkeys(sorted(flows, key=_start_order))  # an ordered set
    while active:
        share = min(left[r] / load[r] for r in load if load[r] > 0)
        # links within round-off of the same share saturate together (no sliver left behind)
        full = {r for r in load if load[r] > 0 and left[r] / load[r] <= share * (1 + 1e-9)}
        frozen = [f for f in active if any(r in full for r in f.weights)]
        for f in frozen:
            rates[f] = share
            del active[f]
            for res, w in f.weights.items():
                left[res] = max(0.0, left[res] - share * w)
                load[res] -= w
    return rates


def _start_order(flow: Flow) -> int:
    return getattr(flow, "seq", 0)
