"""Collectives played out as ring steps over the cluster's links, and pipeline sends.

A ring all-reduce over p ranks is 2(p-1) steps; in each step every rank sends n/p bytes to
its ring successor, after one latency. All edges of a step (and of every group running the
same collective at once) are in flight together, so they share the resources they cross.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

import simpy

from simulator.network import Network
from specs import ClusterSpec

RING_STEPS = {"all_reduce": lambda p: 2 * (p - 1), "all_gather": lambda p: p - 1,
              "reduce_scatter": lambda p: p - 1, "all_to_all": lambda p: p - 1}
"""Number of ring steps of each collective on p ranks; each step moves n/p bytes per rank
(all-to-all: pairwise exchange, step k sends rank i's block for rank i + k)."""


def pairwise_steps(groups: Sequence[Sequence[int]], nbytes: float) -> list:
    """All-to-all as p - 1 pairwise steps: in step k every rank sends n/p to the rank k after it."""
    p = max(len(g) for g in groups)
    return [(tuple((g[i], g[(i + k) % len(g)]) for g in groups if len(g) > 1 for i in range(len(g))), nbytes / p)
            for k in range(1, p)]


def ring_edges(groups: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Every (sender, receiver) pair of one ring step, over all groups."""
    edges = []
    for g in groups:
        if len(g) > 1:
            edges.extend((g[i], g[(i + 1) % len(g)]) for i in range(len(g)))
    return edges


@dataclass(frozen=True, kw_only=True)
class LinkCalibration:
    """How close transfers get to the links' data-sheet bandwidth, and fixed costs.

    Taken from the cost model (CostModel.link_calibration: the analytical model's constants,
    the profiled model's measured tables), so the simulator and the model agree on an
    uncontended link.
    """

    bus_efficiency: float = 1.0
    """Achieved fraction of link bandwidth in collectives inside a node."""
    network_efficiency: float = 1.0
    """The same for transfers that cross nodes."""
    p2p_efficiency: float = 1.0
    """The same for a pipeline send inside a node."""
    base_latency_s: float = 0.0
    """Fixed cost of launching one collective or send."""
    step_latency_factor: float = 1.0
    """Multiplier of the cluster's per-hop latency for each step."""
    overlap_coefficient: float = 1.0
    """Galvatron's gamma: how much compute and data-parallel traffic on one GPU slow each other
    when they run together (simulator.hardware.Contention; 1: not at all)."""
    collective_slowdown: Mapping[str, float] = field(default_factory=dict)
    """Per collective kind: how many times its ring's bytes the links carry (a backend that
    runs it slower than its ring, e.g. gloo's reduce-scatter as an all-reduce); 1 if absent."""

    @classmethod
    def from_cost_model(cls, cost_model) -> "LinkCalibration":
        """The cost model's own figures (CostModel.link_calibration), so the simulator and the
        model agree on an uncontended link."""
        return cls(**cost_model.link_calibration())


Step = tuple[tuple[tuple[int, int], ...], float]
"""The edges that send in one step, and the bytes each of them sends."""


class Fabric:
    """Turns collectives and sends into flows on a Network, using ClusterSpec.path."""

    def __init__(self, env: simpy.Environment, cluster: ClusterSpec, network: Network,
                 coalesce_steps: bool = False, calibration: LinkCalibration | None = None) -> None:
        self.env = env
        self.cluster = cluster
        self.network = network
        self.coalesce_steps = coalesce_steps
        """Play all steps of a collective as one flow (same time when contention does not
        change mid-collective; far fewer events at scale)."""
        self.cal = calibration or LinkCalibration()
        self._paths: dict[tuple[int, int], dict[Hashable, int]] = {}
        self._bundles: dict[tuple, tuple[dict[Hashable, int], float, bool]] = {}
        self._bundle_ids: dict[tuple, tuple] = {}
        """(id(edges), keep) -> (edges, bundle): the same lookup by identity."""
        self._algorithms: dict[tuple, list[Step]] = {}
        self._schedules: dict[tuple, list[tuple]] = {}
        self.focus_ranks: set[int] = set()
        """Ranks that symmetric workers stand for (their own links are modelled exactly)."""
        self.exact_resources: set[Hashable] = set()
        """Resources on edges to or from a focus rank: their load is complete."""

    # -- topology ------------------------------------------------------------------------
    def edge_weights(self, src: int, dst: int) -> dict[Hashable, int]:
        key = (src, dst)
        if key not in self._paths:
            hops = self.cluster.path(src, dst)
            for res, cap in hops:
                self.network.add_resource(res, cap)
            self._paths[key] = {res: 1 for res, _ in hops}
        return self._paths[key]

    def bundle(self, edges: Sequence[tuple[int, int]], keep: frozenset | None = None
               ) -> tuple[dict[Hashable, int], float, bool]:
        """Resource weights of all ``edges`` together, per-step latency (s), crosses nodes.

        ``keep`` (symmetry shortcut): only the resources crossed by edges sent from these
        ranks are kept, with the load of all edges on them. The other resources are
        symmetric copies carrying the same load, so the bottleneck rate is unchanged and
        the network has far fewer resources to balance.
        """
        # a ring repeats one edges tuple in every step: found by identity, not by hashing its
        # p edges again in each of the 2(p - 1) steps (O(p^2) per collective at 16,384 GPUs)
        seen = self._bundle_ids.get((id(edges), keep))
        if seen is not None and seen[0] is edges:
            return seen[1]
        key = (tuple(edges), keep)
        if key not in self._bundles:
            load: Counter = Counter()
            for a, b in edges:
                load.update(self.edge_weights(a, b))
            if keep is not None:
                mine = {res for a, b in edges if a in keep for res in self.edge_weights(a, b)}
                load = Counter({res: w for res, w in load.items() if res in mine})
                self.exact_resources.update(self._exact(edges))
            crosses = any(self.cluster.domain_of(a) != self.cluster.domain_of(b) for a, b in edges)
            lat_us = self.cluster.inter_node.latency_us if crosses else self.cluster.intra_node.latency_us
            self._bundles[key] = (dict(load), lat_us * 1e-6 * self.cal.step_latency_factor, crosses)
        self._bundle_ids[(id(edges), keep)] = (edges, self._bundles[key])  # holds edges: its id stays its own
        return self._bundles[key]

    def _exact(self, edges):
        """Resources whose whole load the shortcut keeps: a focus rank's own ports, and the
        shared links (PCIe uplinks, NICs) its sends cross; not other ranks' GPU ports."""
        for a, b in edges:
            for res in self.edge_weights(a, b):
                port = res[0] in ("gpu_in", "gpu_out")
                own_send = a in self.focus_ranks and (not port or res == ("gpu_out", a))
                if own_send or (b in self.focus_ranks and res == ("gpu_in", b)):
                    yield res

    def _alone_s(self, steps: list[Step]) -> float:
        """Time of ``steps`` on otherwise idle links (to choose an algorithm)."""
        total, rates = 0.0, {}
        for edges, nbytes in steps:
            weights, latency, _ = self.bundle(edges)
            if id(weights) not in rates:  # the same bundle in every step of a ring
                rates[id(weights)] = min(self.network.capacity[r] / w for r, w in weights.items())
            total += latency + nbytes / rates[id(weights)]
        return total

    # -- play-out ------------------------------------------------------------------------
    def collective(self, name: str, kind: str, nbytes: float, groups: Sequence[Sequence[int]],
                   per_edge: bool = False, focus: int | None = None, repeat: int = 1):
        """Generator: ``kind`` over every group of ``groups`` at once (``nbytes`` per rank).

        per_edge=False plays each step as one bundle of identical streams (all groups are
        symmetric copies); per_edge=True gives every edge its own flow (the full simulation).
        ``focus``: the rank a symmetric worker stands for (see ``bundle``). ``repeat``: that
        many identical collectives back to back (a layer's TP all-reduces).
        """
        if kind not in RING_STEPS:
            raise ValueError(f"collective kind must be one of {', '.join(RING_STEPS)}, got {kind!r}")
        key = (kind, nbytes, tuple(map(tuple, groups)), per_edge, focus, repeat)
        if key not in self._schedules:
            groups = tuple(tuple(g) for g in groups if len(g) > 1)
            steps = self._algorithm(kind, nbytes, groups) if groups and nbytes > 0 else []
            keep = None if focus is None else next((frozenset(g) for g in groups if focus in g), None)
            self._schedules[key] = self._schedule(steps, per_edge, False, keep, repeat,
                                                  self.cal.collective_slowdown.get(kind, 1.0))
        yield from self._play(name, self._schedules[key], per_edge)

    def send(self, name: str, nbytes: float, pairs: Sequence[tuple[int, int]], per_edge: bool = False,
             focus: int | None = None, step_of: str | None = None):
        """Generator: point-to-point sends of ``nbytes`` on every (src, dst) pair at once: pipeline
        sends at the p2p calibration, or with ``step_of`` (a collective kind) one step of that
        collective's ring (every rank sends and receives at once, as a context-parallel K/V ring
        step does) at that collective's calibration and slowdown."""
        key = ("send", nbytes, tuple(pairs), per_edge, focus, step_of)
        if key not in self._schedules:
            pairs = tuple((a, b) for a, b in pairs if a != b)
            steps = [(pairs, float(nbytes))] if pairs and nbytes > 0 else []
            keep = None if focus is None else frozenset([focus])
            slowdown = 1.0 if step_of is None else self.cal.collective_slowdown.get(step_of, 1.0)
            self._schedules[key] = self._schedule(steps, per_edge, step_of is None, keep, 1, slowdown)
        yield from self._play(name, self._schedules[key], per_edge)

    def _algorithm(self, kind: str, nbytes: float, groups: tuple) -> list[Step]:
        """Ring steps; for an all-reduce over power-of-two groups, recursive halving-doubling
        when it is faster on idle links (fewer latency-bound steps, same bytes). Like NCCL's
        tuner, the choice looks at one group alone, not at what else runs."""
        key = (kind, nbytes, groups)
        if key not in self._algorithms:
            p = max(len(g) for g in groups)
            use_hd = False
            if kind == "all_reduce" and p > 2 and all(len(g) == p for g in groups) and p & (p - 1) == 0:
                one = groups[:1]
                ring_one = [(tuple(ring_edges(one)), nbytes / p)] * RING_STEPS[kind](p)
                use_hd = self._alone_s(halving_doubling(one, nbytes)) < self._alone_s(ring_one)
            if kind == "all_to_all":
                self._algorithms[key] = pairwise_steps(groups, nbytes)
            elif use_hd:
                self._algorithms[key] = halving_doubling(groups, nbytes)
            else:
                self._algorithms[key] = [(tuple(ring_edges(groups)), nbytes / p)] * RING_STEPS[kind](p)
        return self._algorithms[key]

    def _efficiency(self, steps: list[Step], p2p: bool) -> float:
        if any(self.bundle(edges)[2] for edges, _ in steps):
            return self.cal.network_efficiency
        return self.cal.p2p_efficiency if p2p else self.cal.bus_efficiency

    def _schedule(self, steps: list[Step], per_edge: bool, p2p: bool, keep: frozenset | None,
                  repeat: int, slowdown: float = 1.0) -> list[tuple]:
        """(wait_s, edges, resource weights, wire bytes) of each flow to play, worked out once."""
        if not steps:
            return []
        efficiency = self._efficiency(steps, p2p) / slowdown
        waits = [self.bundle(edges)[1] for edges, _ in steps]
        waits[0] += self.cal.base_latency_s  # the launch cost, paid once per collective
        steps, waits = steps * repeat, waits * repeat
        if self.coalesce_steps and not per_edge and self._same_load(steps, keep):
            waits, steps = [sum(waits)], [(steps[0][0], sum(b for _, b in steps))]
        # wire bytes: what the links carry for nbytes of payload at the achieved efficiency
        return [(wait, edges, self.bundle(edges, keep)[0], nbytes / efficiency)
                for (edges, nbytes), wait in zip(steps, waits)]

    def _play(self, name: str, schedule: list[tuple], per_edge: bool):
        for wait, edges, weights, wire in schedule:
            if wait > 0:
                yield self.env.timeout(wait)
            if per_edge:
                yield self.env.all_of([self.network.put(name, wire, self.edge_weights(a, b)) for a, b in edges])
            else:
                yield self.network.put(name, wire, weights, streams=len(edges))

    def _same_load(self, steps: list[Step], keep: frozenset | None) -> bool:
        """Do all steps load the same resources equally (then one flow can stand for them)?"""
        first = self.bundle(steps[0][0], keep)[0]
        return all(edges is steps[0][0] or self.bundle(edges, keep)[0] == first for edges, _ in steps[1:])


def halving_doubling(groups: Sequence[Sequence[int]], nbytes: float) -> list[Step]:
    """Recursive halving reduce-scatter then recursive doubling all-gather: 2 log2(p) steps;
    in step j of the first half each rank swaps n / 2^(j+1) bytes with the rank p / 2^(j+1) away."""
    p = len(groups[0])
    half = []
    dist, chunk = p // 2, nbytes / 2
    while dist >= 1:
        edges = tuple((g[i], g[i ^ dist]) for g in groups for i in range(p))
        half.append((edges, chunk))
        dist, chunk = dist // 2, chunk / 2
    return half + half[::-1]


class Rendezvous:
    """Full simulation: a collective starts when every member of its group has asked for it."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._pending: dict[Hashable, list] = {}

    def arrive(self, key: Hashable, size: int, start) -> simpy.Event:
        """Count one member in; the last one calls ``start()`` (a generator) as a process."""
        entry = self._pending.setdefault(key, [0, self.env.event()])
        entry[0] += 1
        if entry[0] == size:
            del self._pending[key]
            proc = self.env.process(start())
            proc.callbacks.append(lambda _e, done=entry[1]: done.succeed())
        return entry[1]
