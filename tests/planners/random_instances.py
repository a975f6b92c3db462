"""Small random planning instances: a CostModel whose every answer is a seeded random number.

Layer i is told apart by its seq_len. Times are whole multiples of 0.1 us and memory whole KiB, so
the float solvers and CP-SAT's integers see the same numbers. The embedding/head cost follows the
structure the planners rely on: a base per (stage, pp, batch, micro-batches, vocab tp) plus terms
that depend on the dp type of the first layer (stage 0) and of the last layer (last stage), and
the relayout between the vocabulary's layout and the first/last layer's (vocab_relayout_time).
"""
from __future__ import annotations

import zlib

from dataclasses import replace

import numpy as np

from cost_models import CostModel, LayerTime, MemoryBreakdown
from cost_models.tp_overlap import OverlapPair
from planners import Budget, SearchSpace
from specs import (ClusterSpec, EmbeddingSpec, GPUSpec, HeadSpec, IntraNodeLink, LayerSpec, ModelSpec,
                   Plan)
from specs.capabilities import Capabilities
from specs.stack import SoftwareStack

KIB = 1024
TICK_S = 1e-7


class RandomCostModel(CostModel):
    """Every (question, arguments) pair gets its own seeded random answer."""

    name = "random-test"

    def __init__(self, cluster: ClusterSpec, seed: int) -> None:
        super().__init__(cluster)
        self.seed = seed
        self.runtime_overhead_bytes = 64 * KIB

    def _rng(self, *key) -> np.random.Generator:
        # the default Ulysses, cp and precision fields left out of the key: the instances stay those the
        # tests' seeds were chosen on (before LayerStrategy had the fields)
        text = repr(key).replace(" ulysses=1,", "").replace(" cp=1, cp_comm=<CPComm.P2P: 'p2p'>,", "")
        text = text.replace(", precision=<Precision.BF16: 'bf16'>", "")
        return np.random.default_rng([self.seed, zlib.crc32(text.encode())])

    def _ticks(self, rng, lo: int, hi: int) -> float:
        return int(rng.integers(lo, hi)) * TICK_S

    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0):
        rng = self._rng("t", layer.seq_len, strategy, micro_batch_size, first_rank)
        return LayerTime(forward_s=self._ticks(rng, 1000, 20000), backward_s=self._ticks(rng, 1000, 40000),
                         tp_comm_s=self._ticks(rng, 0, 5000) if strategy.tp > 1 else 0.0,
                         exposed_dp_comm_s=self._ticks(rng, 0, 30000) if strategy.dp > 1 else 0.0,
                         update_s=self._ticks(rng, 0, 3000))

    def layer_memory(self, layer, strategy, micro_batch_size, in_flight):
        rng = self._rng("m", layer.seq_len, strategy, micro_batch_size)
        states = int(rng.integers(100, 4000)) * KIB
        act = int(rng.integers(10, 1000)) * KIB
        temp = int(rng.integers(0, 800)) * KIB if rng.random() < 0.5 else 0
        return MemoryBreakdown(parameters_bytes=states, activations_bytes=act * in_flight, temporary_bytes=temp)

    def weight_wait_bytes(self, layer, strategy, micro_batch_size):
        rng = self._rng("w", layer.seq_len, strategy, micro_batch_size)
        return int(rng.integers(10, 1000)) * KIB

    def transition_time(self, layer, prev, nxt, micro_batch_size, first_rank=0):
        if (prev.tp, prev.dp, prev.tp_consecutive) == (nxt.tp, nxt.dp, nxt.tp_consecutive):
            return 0.0
        rng = self._rng("r", layer.seq_len, prev.tp, prev.dp, prev.tp_consecutive, nxt.tp, nxt.dp,
                        nxt.tp_consecutive, first_rank)
        return self._ticks(rng, 0, 8000)

    def collective_time(self, kind, nbytes, groups):
        return 0.0

    def p2p_time(self, nbytes, src, dst, senders=1):
        rng = self._rng("p", src, dst)
        return self._ticks(rng, 100, 2000) + (int(nbytes) // KIB) * 10 * TICK_S

    def vocab_cost(self, model, plan: Plan, stage, world_size):
        key = (stage, plan.pp, plan.global_batch, plan.micro_batches, plan.vocab_tp)
        rng = self._rng("v", *key)
        t, d = self._ticks(rng, 100, 5000), self._ticks(rng, 0, 2000)
        mem = int(rng.integers(10, 2000)) * KIB
        temp = int(rng.integers(0, 500)) * KIB
        ends = []
        if stage == 0:
            ends.append(("first", plan.layers[0].dp_type))
        if stage == plan.pp - 1:
            ends.append(("last", plan.layers[-1].dp_type))
        for end in ends:
            r = self._rng("ve", *key, *end)
            t += self._ticks(r, 0, 3000)
            d += self._ticks(r, 0, 3000)
            mem += int(r.integers(0, 1500)) * KIB
        if stage == 0:
            t += self.vocab_relayout_time(model, plan, 0, plan.layers[0])
        if stage == plan.pp - 1:
            t += self.vocab_relayout_time(model, plan, len(plan.layers) - 1, plan.layers[-1])
        return LayerTime(forward_s=t, backward_s=0.0, update_s=d), MemoryBreakdown(parameters_bytes=mem,
                                                                                  temporary_bytes=temp)

    def vocab_relayout_time(self, model, plan: Plan, layer_index, strategy):
        rng = self._rng("vr", layer_index == 0, plan.vocab_tp, strategy.tp, strategy.dp, strategy.tp_consecutive)
        return self._ticks(rng, 0, 1500)


class OverlapCostModel(RandomCostModel):
    """RandomCostModel on the megatron-te stack, whose Megatron-SP layers pair a random share of
    their TP time with GEMMs (LayerTime.tp_overlap): what a plan with tp_comm_overlap hides."""

    name = "random-overlap-test"
    stack = SoftwareStack.MEGATRON_TE
    capabilities = Capabilities(stack=frozenset({SoftwareStack.MEGATRON_TE}))

    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0):
        lt = super().layer_time(layer, strategy, micro_batch_size, micro_batches, first_rank)
        if not strategy.megatron_sp or strategy.tp <= 1:
            return lt
        rng = self._rng("o", layer.seq_len, strategy, micro_batch_size)
        hidden = int(rng.integers(0, 5000)) * TICK_S
        pair = OverlapPair("F", "all_gather", lt.tp_comm_s, hidden, 2 * hidden, True)
        return replace(lt, tp_overlap=(pair,))


def tiny_cluster(gpus: int = 4) -> ClusterSpec:
    return ClusterSpec(name=f"test-{gpus}", nodes=1, gpus_per_node=gpus,
                       gpu=GPUSpec(name="test", peak_tflops=1.0, memory_gib=1.0, memory_bandwidth_gbytes_per_s=1.0),
                       intra_node=IntraNodeLink(kind="nvswitch", bandwidth_gbytes_per_s=1.0, latency_us=1.0))


def tiny_model(layers: int, identical: bool = False) -> ModelSpec:
    specs = [LayerSpec(kind="gpt", hidden_size=64, num_heads=4, ffn_hidden_size=256,
                       seq_len=16 if identical else 16 + i) for i in range(layers)]
    return ModelSpec(name=f"rand-{layers}", embedding=EmbeddingSpec(hidden_size=64, vocab_size=64),
                     layers=tuple(specs), head=HeadSpec(hidden_size=64, output_size=64))


SMALL_SPACE = SearchSpace(max_tp=4, max_pp=2, dp_types=("ddp", "zero3"), micro_batches=(1, 2),
                          vocab_tp=(1, 2))
"""Up to 14 strategies a layer, pp 1 or 2, two micro-batch counts, two vocab tps."""

ENLARGED_SPACE = replace(SMALL_SPACE, recompute=("none", "selective", "full"), sp=("none", "megatron", "ulysses"),
                         vocab_sp=("none", "megatron"), vocab_zero3=(False, True), virtual_stages=(1, 2))
"""SMALL_SPACE with the issue-15 dimensions: recompute, sequence parallelism, vocabulary
ZeRO-3/sp and interleaving."""


def instance(seed: int) -> tuple[ModelSpec, ClusterSpec, RandomCostModel, Budget]:
    """Layers 2-5 (sometimes identical), a random budget; some budgets fit nothing."""
    rng = np.random.default_rng(seed)
    model = tiny_model(int(rng.integers(2, 6)), identical=bool(rng.random() < 0.3))
    cluster = tiny_cluster()
    cm = RandomCostModel(cluster, seed)
    kib = int(rng.integers(400, 14000))
    return model, cluster, cm, Budget(memory_gib=kib * KIB / 1024**3, global_batch=4)
