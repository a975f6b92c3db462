"""ClusterSpec: nodes of GPUs, the links inside a node and between nodes, and what a group sees.

Ranks are numbered node-major: rank r sits on node r // gpus_per_node and in scale-up domain
r // domain_gpus (an NVLink domain of one node, or of a whole rack: GB200 NVL72). A link is a set
of named resources (a GPU's port, a PCIe switch uplink, a node's NICs), each with a capacity; a
transfer between two ranks crosses a list of them (``path``). Rings of concurrent collectives
share those resources, which gives the bandwidth each group sees. File format: docs/clusters.md.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Sequence

import numpy as np

from specs.errors import SpecError, check_fields, one_of, positive_int, positive_number, require
from specs.hashing import cached_hash, without_cached_hash
from specs.limits import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NODES, MAX_SCALE_UP_DOMAIN_GPUS, at_most, unit_time
from specs.schema import ClusterFile, check

INTRA_KINDS = ("nvswitch", "nvlink", "pcie", "shm")
"""nvswitch/nvlink: every GPU has its own port; pcie: GPUs under a switch share its uplink to
the CPU; shm: CPU processes on one host (the executor's tests)."""
NVLINK_KINDS = ("nvswitch", "nvlink")
"""The intra-node kinds that give every GPU its own NVLink port: what a scale-up domain beyond a
node and DeepEP's intranode kernels need."""


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator."""

    name: str
    peak_tflops: float
    """Dense bf16/fp16 tensor-core peak, TFLOP/s (the figure the cost models use)."""
    memory_gib: float
    """Device memory, GiB."""
    memory_bandwidth_gbytes_per_s: float
    """HBM/GDDR bandwidth, GB/s."""
    source: str = ""
    """Where the figures come from (data sheet, measurement); informational."""
    peak_fp8_tflops: float | None = None
    """Dense FP8 tensor-core peak, TFLOP/s; None = not stated, and FP8 plans are refused on it.
    The analytical model runs FP8 GEMMs at this peak (specs.precision)."""
    mxfp8: bool = False
    """Tensor cores that take MX block-scaled FP8 operands (one scale per 32 elements): Blackwell.
    Plans in ``mxfp8`` need it."""
    sdpa_flash_tflops: float | None = None
    """What PyTorch's scaled_dot_product_attention reaches on this GPU with its default fused
    kernel (the flash backend, FlashAttention-2), bf16, TFLOP/s: the attention of the eager and
    compile stacks runs at it. None: that kernel runs at the GEMM efficiency, as a fused
    attention kernel written for the GPU does (FlashAttention-2 on Ampere)."""

    def __post_init__(self) -> None:
        for name in ("peak_tflops", "memory_gib", "memory_bandwidth_gbytes_per_s"):
            positive_number(getattr(self, name), f"gpu.{name}")
        unit_time(1 / self.peak_tflops, "gpu.peak_tflops", self.peak_tflops, "1 TFLOP")
        _link_times(self.memory_bandwidth_gbytes_per_s, 0.0, "gpu.memory_bandwidth_gbytes_per_s", "")
        for name in ("peak_fp8_tflops", "sdpa_flash_tflops"):
            if getattr(self, name) is not None:
                positive_number(getattr(self, name), f"gpu.{name}")
        if not isinstance(self.mxfp8, bool):
            raise SpecError("gpu.mxfp8", f"must be true or false, got {self.mxfp8!r}")
        if self.mxfp8 and self.peak_fp8_tflops is None:
            raise SpecError("gpu.mxfp8", "true needs gpu.peak_fp8_tflops (MXFP8 GEMMs run at the FP8 peak)")


@dataclass(frozen=True, kw_only=True)
class IntraNodeLink:
    """Links between the GPUs of one node."""

    kind: str
    """One of INTRA_KINDS."""
    bandwidth_gbytes_per_s: float
    """Per GPU and direction: NVLink total/2, or a PCIe x16 slot."""
    latency_us: float
    """One-hop latency, microseconds."""
    gpus_per_switch: int = 0
    """pcie: GPUs behind one PCIe switch (0 = all GPUs on one switch)."""
    switch_uplink_gbytes_per_s: float = 0.0
    """pcie: bandwidth per direction between a switch and the rest of the node."""

    def __post_init__(self) -> None:
        one_of(self.kind, INTRA_KINDS, "intra_node.kind")
        positive_number(self.bandwidth_gbytes_per_s, "intra_node.bandwidth_gbytes_per_s")
        positive_number(self.latency_us, "intra_node.latency_us", allow_zero=True)
        _link_times(self.bandwidth_gbytes_per_s, self.latency_us, "intra_node.bandwidth_gbytes_per_s",
                    "intra_node.latency_us")
        if self.gpus_per_switch != 0:  # 0: no switch level
            positive_int(self.gpus_per_switch, "intra_node.gpus_per_switch")
        if self.kind == "pcie" and self.gpus_per_switch:
            positive_number(self.switch_uplink_gbytes_per_s, "intra_node.switch_uplink_gbytes_per_s")
            _link_times(self.switch_uplink_gbytes_per_s, 0.0, "intra_node.switch_uplink_gbytes_per_s", "")


@dataclass(frozen=True, kw_only=True)
class InterNodeLink:
    """The network between nodes."""

    nics_per_node: int = 1
    nic_bandwidth_gbytes_per_s: float = 12.5
    """Per NIC and direction (100 Gb/s = 12.5 GB/s; HDR 200 Gb/s = 25 GB/s)."""
    latency_us: float = 10.0

    def __post_init__(self) -> None:
        positive_int(self.nics_per_node, "inter_node.nics_per_node")
        positive_number(self.nic_bandwidth_gbytes_per_s, "inter_node.nic_bandwidth_gbytes_per_s")
        positive_number(self.latency_us, "inter_node.latency_us", allow_zero=True)
        _link_times(self.nic_bandwidth_gbytes_per_s, self.latency_us, "inter_node.nic_bandwidth_gbytes_per_s",
                    "inter_node.latency_us")


def _link_times(gbytes_per_s: float, latency_us: float, bandwidth_field: str, latency_field: str) -> None:
    """The times a link's numbers make are finite and bounded (specs.limits.unit_time)."""
    unit_time(1 / gbytes_per_s, bandwidth_field, gbytes_per_s, "moving 1 GB")
    if latency_field:
        unit_time(latency_us * 1e-6, latency_field, latency_us, "one hop")


@dataclass(frozen=True)
class GroupLink:
    """What a collective over a group sees: bottleneck bandwidth per ring edge, and latency."""

    bandwidth_gbytes_per_s: float
    latency_s: float
    crosses_nodes: bool
    """Some transfer leaves its scale-up domain (crosses the network's NICs); ranks on two nodes of
    one NVLink domain (GB200 NVL72 trays) do not cross."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A cluster: ``nodes`` identical nodes of ``gpus_per_node`` GPUs."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu: GPUSpec
    intra_node: IntraNodeLink
    inter_node: InterNodeLink = field(default_factory=InterNodeLink)
    calibration: str = ""
    """Optional path of a cost-model calibration file (relative to the cluster file)."""
    scale_up_domain_gpus: int = 0
    """GPUs that reach each other over the intra-node link (NVLink/NVSwitch) whatever node they
    sit on: 0 = one node; a multiple of gpus_per_node when larger (GB200 NVL72: 72 GPUs on 18
    trays of 4). Ranks in different domains talk through their nodes' NICs."""
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """(field path, where its figure comes from) pairs from the file's ``sources``; informational."""

    __hash__ = cached_hash  # a key of the cost models' topology caches, asked per collective
    __getstate__ = without_cached_hash

    def __post_init__(self) -> None:
        positive_int(self.nodes, "nodes")
        positive_int(self.gpus_per_node, "gpus_per_node")
        at_most(self.nodes, MAX_NODES, "nodes", "the largest published training runs")
        at_most(self.gpus_per_node, MAX_GPUS_PER_NODE, "gpus_per_node", "rack-scale NVLink domains")
        at_most(self.world_size, MAX_GPUS, "nodes*gpus_per_node", "the simulator plays every rank")
        per = self.intra_node.gpus_per_switch
        require(per == 0 or self.gpus_per_node % per == 0, "intra_node.gpus_per_switch",
                f"gpus_per_switch({per}) does not divide gpus_per_node({self.gpus_per_node})")
        domain = self.scale_up_domain_gpus
        if domain:
            positive_int(domain, "scale_up_domain_gpus")
            at_most(domain, MAX_SCALE_UP_DOMAIN_GPUS, "scale_up_domain_gpus", "NVLink 5's largest domain")
            require(domain % self.gpus_per_node == 0, "scale_up_domain_gpus",
                    f"{domain} is not a multiple of gpus_per_node({self.gpus_per_node})")
            require(domain == self.gpus_per_node or self.intra_node.kind in NVLINK_KINDS,
                    "scale_up_domain_gpus", f"a domain of {domain} GPUs beyond one node needs an "
                    f"nvswitch or nvlink intra_node link, not {self.intra_node.kind!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs of one scale-up domain (a node unless scale_up_domain_gpus says more)."""
        return self.scale_up_domain_gpus or self.gpus_per_node

    def with_nodes(self, nodes: int) -> "ClusterSpec":
        """The same node type, ``nodes`` of them (``dgx-a100-80g:64``)."""
        from dataclasses import replace
        positive_int(nodes, "nodes")
        base = self.name.split(":")[0]
        return replace(self, nodes=nodes, name=f"{base}:{nodes}")

    # -- topology ---------------------------------------------------------------------
    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def domain_of(self, rank: int) -> int:
        """The scale-up domain of ``rank``: ranks of one domain never cross a NIC."""
        return rank // self.domain_gpus

    def switch_of(self, rank: int) -> int:
        """The PCIe switch of ``rank`` inside its node (0 where the GPUs share one fabric)."""
        per = self.intra_node.gpus_per_switch or self.gpus_per_node
        return (rank % self.gpus_per_node) // per

    def path(self, src: int, dst: int) -> list[tuple[tuple, float]]:
        """Resources a src -> dst transfer crosses, each as (resource id, GB/s capacity): the two GPU
        ports, a PCIe switch's uplinks, and the nodes' NICs when the ranks sit in two scale-up
        domains (inside one NVLink domain the switches carry the transfer, whatever the node)."""
        intra = self.intra_node
        hops: list[tuple[tuple, float]] = [(("gpu_out", src), intra.bandwidth_gbytes_per_s)]
        n_src, n_dst = self.node_of(src), self.node_of(dst)
        s_src, s_dst = self.switch_of(src), self.switch_of(dst)
        shared_uplink = intra.kind == "pcie" and intra.gpus_per_switch > 0
        if shared_uplink and (n_src != n_dst or s_src != s_dst):
            up = intra.switch_uplink_gbytes_per_s
            hops.append((("uplink_up", n_src, s_src), up))
            hops.append((("uplink_down", n_dst, s_dst), up))
        if self.domain_of(src) != self.domain_of(dst):
            nic = self.inter_node.nics_per_node * self.inter_node.nic_bandwidth_gbytes_per_s
            hops.append((("nic_out", n_src), nic))
            hops.append((("nic_in", n_dst), nic))
        hops.append((("gpu_in", dst), intra.bandwidth_gbytes_per_s))
        return hops

    def ring_link(self, groups: Sequence[Sequence[int]]) -> GroupLink:
        """Bandwidth per ring edge when every group in ``groups`` runs a ring at once.

        Each group's ring visits its ranks in the given order; edges that cross the same
        resource share it equally. The slowest group sets the result (they run in lockstep).
        """
        rings = [g for g in groups if len(g) > 1]
        src = np.fromiter(chain.from_iterable(rings), dtype=np.int64, count=sum(map(len, rings)))
        lengths = np.fromiter(map(len, rings), dtype=np.int64, count=len(rings))
        starts = np.cumsum(lengths) - lengths
        after = np.arange(1, len(src) + 1)  # each rank sends to the next of its ring, the last to the first
        after[starts + lengths - 1] = starts
        return self._edges_link(src, src[after])

    def transfers_link(self, pairs: Sequence[tuple[int, int]]) -> GroupLink:
        """Bandwidth each (src, dst) transfer gets when all of ``pairs`` run at once: transfers
        that cross the same resource share it equally; the slowest one sets the result."""
        src, dst = (np.fromiter((e[i] for e in pairs), dtype=np.int64, count=len(pairs)) for i in (0, 1))
        return self._edges_link(src, dst)

    def _edges_link(self, src: np.ndarray, dst: np.ndarray) -> GroupLink:
        """transfers_link of the pairs (src[i], dst[i]), a rank's transfers to itself left out."""
        moves = src != dst
        src, dst = src[moves], dst[moves]
        if not len(src):
            return GroupLink(float("inf"), 0.0, False)
        for ranks in (src, dst):
            bad = ranks[(ranks < 0) | (ranks >= self.world_size)]
            require(bad.size == 0, "ranks", f"rank {bad[0] if bad.size else 0} outside world of {self.world_size}")
        crosses = bool((src // self.domain_gpus != dst // self.domain_gpus).any())
        shared_uplink = self.intra_node.kind == "pcie" and self.intra_node.gpus_per_switch > 0
        bandwidth = (self._paths_bandwidth(list(zip(src.tolist(), dst.tolist()))) if shared_uplink
                     else self._ports_bandwidth(src, dst))
        latency_us = self.inter_node.latency_us if crosses else self.intra_node.latency_us
        return GroupLink(bandwidth, latency_us * 1e-6, crosses)

    def _paths_bandwidth(self, edges: list[tuple[int, int]]) -> float:
        """Each edge's path (``path``) laid out, each resource shared equally by the edges on it."""
        paths = [self.path(a, b) for a, b in edges]
        load = Counter(res for p in paths for res, _ in p)
        return min(cap / load[res] for p in paths for res, cap in p)

    def _ports_bandwidth(self, src: np.ndarray, dst: np.ndarray) -> float:
        """``_paths_bandwidth`` where a path is only GPU ports and, across scale-up domains, the
        nodes' NICs: the slowest edge is the one on the most loaded resource, so count the edges
        per port and per NIC instead of laying out each path (the same number)."""
        port_gbs = self.intra_node.bandwidth_gbytes_per_s
        worst_port = max(np.bincount(src).max(), np.bincount(dst).max())
        bandwidth = port_gbs / worst_port
        across = src // self.domain_gpus != dst // self.domain_gpus
        if across.any():
            nic_gbs = self.inter_node.nics_per_node * self.inter_node.nic_bandwidth_gbytes_per_s
            nodes = self.gpus_per_node
            worst_nic = max(np.bincount(src[across] // nodes).max(), np.bincount(dst[across] // nodes).max())
            bandwidth = min(bandwidth, nic_gbs / worst_nic)
        return float(bandwidth)

    def group_link(self, ranks: Sequence[int]) -> GroupLink:
        """What one collective over ``ranks`` sees when it runs alone."""
        return self.ring_link([ranks])


def cluster_from_dict(raw: Any, name: str = "cluster") -> ClusterSpec:
    """A ClusterSpec from a parsed JSON object; errors name the field."""
    check(ClusterFile, raw)  # types, ranges, limits and cross-field rules, before any dataclass
    gpu = GPUSpec(**_section(raw, "gpu", GPUSpec))
    intra = IntraNodeLink(**_section(raw, "intra_node", IntraNodeLink))
    inter = InterNodeLink(**_section(raw, "inter_node", InterNodeLink, required=False))
    return ClusterSpec(name=str(raw.get("name", name)), nodes=raw.get("nodes", 1),
                       gpus_per_node=raw.get("gpus_per_node"), gpu=gpu, intra_node=intra,
                       inter_node=inter, calibration=str(raw.get("calibration", "")),
                       scale_up_domain_gpus=raw.get("scale_up_domain_gpus", 0),
                       sources=tuple(sorted(raw.get("sources", {}).items())))


def _section(raw: dict, key: str, cls: type, required: bool = True) -> dict:
    """The object ``raw[key]``, its keys checked against the fields of ``cls``."""
    value = raw.get(key, None if required else {})
    if not isinstance(value, dict):
        raise SpecError(key, f"must be a JSON object, got {value!r}")
    check_fields(cls, value, key)
    return value
