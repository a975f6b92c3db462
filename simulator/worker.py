"""The program one GPU runs in an iteration: its stage's schedule of forwards and backwards,
with TP collectives on the critical path, pipeline sends, bucketed data-parallel sync
overlapped with backward, ZeRO-3 gathers with prefetch, and the optimizer step.

A Worker stands for one rank (full simulation) or for every rank of its stage at once
(symmetric shortcut): then its collectives run over all groups of the stage as bundles.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import simpy

from cost_models.base import in_flight
from simulator.collectives import Fabric, Rendezvous
from simulator.hardware import GPU, Channel
from simulator.work import LayerWork, StageWork, SyncWork
from specs import CPComm, DPType
from specs.schedules import OpKind, schedule_entry


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Iteration-wide settings every worker shares."""

    schedule: str
    """A registered schedule (specs.schedules): its op order is what each stage plays."""
    pp: int
    micro_batches: int
    full: bool
    """One worker per rank (True) or per stage (False)."""
    virtual_stages: int = 1
    """The schedule's model chunks per stage."""
    overlap_dp: bool = True
    """Start gradient sync of a bucket as soon as its last backward is done; False waits
    for the whole backward (the cost-model formula's assumption)."""
    bucket_bytes: float = 25 * 2**20
    """Gradient bucket size (PyTorch DDP's default 25 MiB)."""
    prefetch: bool = True
    """ZeRO-3: gather the next layer's parameters while this one computes."""
    lazy_gradients: bool = False
    """Gradients take memory from the first backward that makes them (CostModel.lazy_gradients)."""


TP_TAGS = {"all_reduce": "tp", "reduce_scatter": "sp rs", "all_gather": "sp ag", "all_to_all": "a2a"}
"""How a TP-group collective's kind shows in span names."""


class Worker:
    """Runs one stage's schedule on ``gpu``; wired to its neighbours by ``prev``/``next``."""

    def __init__(self, env: simpy.Environment, work: StageWork, gpu: GPU, fabric: Fabric,
                 config: WorkerConfig, rendezvous: Rendezvous | None = None) -> None:
        self.env = env
        self.work = work
        self.gpu = gpu
        self.fabric = fabric
        self.cfg = config
        self.rendezvous = rendezvous
        self.rank = gpu.rank
        self.per_stage = len(work.ranks)
        self.peers: dict[int, Worker] = {}
        """The worker (same position in its stage) that runs each global chunk (engine._wire)."""
        self._split = schedule_entry(config.schedule).splits_backward
        """The backward runs as B (input gradient, sent back) and a later W (weight gradient)."""
        self._holds_head = any(c.index == config.pp * config.virtual_stages - 1 for c in work.chunks)
        self.inbox = {"F": simpy.FilterStore(env), "B": simpy.FilterStore(env)}
        """(micro-batch, chunk) messages; a chunk waits for its own (interleaving reorders them)."""
        self.end_s = 0.0
        self.optimizer_s = 0.0
        self._backwards = 0
        self._gathers: dict[tuple, simpy.Event] = {}
        self._buckets: list[list[SyncWork]] = [[], []]
        """Gradients waiting to sync: dense parts (or whole layers), and routed-expert parts."""
        self._sync: list[simpy.Event] = []
        self._deferred: list[tuple[list[SyncWork], str]] = []
        """Buckets synced after the whole backward (overlap_dp=False, DDP/ZeRO-1)."""
        self._after_backward: list[tuple[list[SyncWork], str]] = []
        self._sharded_syncs: list[simpy.Event] = []
        """ZeRO-3 reduce-scatters (ZeRO-2's too with overlap_dp=False) that the micro-batch's
        backward waits for at its end."""
        self._syncs_launched = 0
        self._made: set[str] = set()
        """Layers (and "vocab") whose gradients hold memory already (lazy gradients)."""
        self.action = env.process(self._run())

    # -- the iteration -------------------------------------------------------------------
    def _run(self):
        self._allocate_states()
        ops = schedule_entry(self.cfg.schedule).ops(self.work.stage, self.cfg.pp, self.cfg.micro_batches,
                                                    self.cfg.virtual_stages)
        play = {OpKind.FORWARD: self._forward, OpKind.BACKWARD: self._backward, OpKind.WEIGHT: self._weight}
        for kind, mb, c in ops:
            yield from play[kind](mb, self.work.chunks[c])
        yield from self._finish()
        self.end_s = self.env.now

    def _allocate_states(self) -> None:
        """Parameters and optimizer states now; gradients too, unless they come lazily."""
        mem, w = self.gpu.memory, self.work
        mem.alloc("runtime overhead", w.runtime_overhead_bytes)
        mem.alloc("vocab states", w.vocab_memory.states_bytes - self._lazy(w.vocab_memory))
        for lw in w.layers:
            mem.alloc(f"{lw.name} states", lw.states.states_bytes - self._lazy(lw.states))

    def _lazy(self, states) -> float:
        return states.gradients_bytes if self.cfg.lazy_gradients else 0.0

    def _gradients_made(self, name: str, states) -> None:
        """A backward made these gradients: they take memory the first time (lazy gradients)."""
        if self.cfg.lazy_gradients and name not in self._made:
            self._made.add(name)
            self.gpu.memory.alloc(f"{name} gradients", states.gradients_bytes)

    def _first_chunk(self, chunk) -> bool:
        return chunk.index == 0

    def _last_chunk(self, chunk) -> bool:
        return chunk.index == self.cfg.pp * self.cfg.virtual_stages - 1

    def _vocab_leads(self, chunk) -> bool:
        """The embedding (first stage) or the per-micro-batch overhead (other stages) runs with
        the stage's first chunk; on the stage with the head it all runs with the model's last chunk."""
        return not self._holds_head and chunk.index == self.work.chunks[0].index

    def _tp_calls(self, phase: str, mb: int, lw: LayerWork):
        """The layer's TP-group collectives of ``phase`` (B: the backward's and a recomputed
        forward's), on the critical path (but those played beside their GEMMs under TP
        communication overlap: _overlapped); calls of one kind and size go as one."""
        passes = ((True, lw.tp_calls),) if phase == "F" else ((False, lw.tp_backward_calls),
                                                              (True, lw.tp_recompute_calls))
        left: dict[tuple[str, float], int] = {}
        for forward, calls in passes:
            for kind, nbytes, count in calls:
                paired = sum(1 for p in lw.tp_overlap if (p.phase, p.kind, p.forward_pass) == (phase, kind, forward))
                left[kind, nbytes] = left.get((kind, nbytes), 0) + max(0, count - paired)
        for (kind, nbytes), count in left.items():
            if count > 0:
                yield from self._collective_now(Channel.TP, f"{phase}{mb} {lw.name} {TP_TAGS[kind]} x{count}", kind,
                                                nbytes, lw.tp_groups, count)

    def _overlapped(self, phase: str, mb: int, lw: LayerWork):
        """TP communication overlap: each paired collective of ``phase`` beside its GEMM, whose
        chunk on the rank's own shard runs first, alone, and the other chunks beside the transfer
        (cost_models/tp_overlap.py); the layer's other compute ran before, less these GEMMs."""
        nbytes = {(forward, kind): n for forward, calls in ((True, lw.tp_calls), (False, lw.tp_backward_calls))
                  for kind, n, _ in calls}
        for i, pair in enumerate(p for p in lw.tp_overlap if p.phase == phase):
            name = f"{phase}{mb} {lw.name} {TP_TAGS[pair.kind]} {i}"
            yield from self.gpu.compute.run(f"{name} gemm own", pair.gemm_s - pair.beside_s)
            done = self._collective(Channel.TP, name, pair.kind, nbytes[pair.forward_pass, pair.kind], lw.tp_groups)
            yield from self.gpu.compute.run(f"{name} gemm beside", pair.beside_s)
            yield done

    def _paired_gemm_s(self, phase: str, lw: LayerWork) -> float:
        """The seconds of the layer's ``phase`` compute that _overlapped plays."""
        return sum(p.gemm_s for p in lw.tp_overlap if p.phase == phase)

    def _ep_calls(self, phase: str, mb: int, lw: LayerWork, rounds: int):
        """The layer's expert dispatch and combine all-to-alls, ``rounds`` passes' worth, on the
        critical path (on the TP stream: tokens wait for their experts' outputs)."""
        for kind, nbytes, count in lw.ep_calls:
            yield from self._collective_now(Channel.TP, f"{phase}{mb} {lw.name} ep a2a x{count * rounds}", kind,
                                            nbytes, lw.ep_groups, count * rounds)

    def _forward(self, mb: int, chunk):
        w = self.work
        if not self._first_chunk(chunk):
            yield self.inbox["F"].get(lambda msg: msg == (mb, chunk.index))
            yield from self._gather_received("F", mb, chunk.input_message)
        if self._vocab_leads(chunk):
            yield from self._vocab("F", mb)  # embedding (first stage) or per-micro-batch overhead (middle)
        layers = [w.layers[p] for p in chunk.positions]
        for pos, lw in enumerate(layers):
            yield from self._gathered(lw, mb, "F", layers[pos + 1] if pos + 1 < len(layers) else None)
            yield from self._layer_forward(mb, lw)
            yield from self._overlapped("F", mb, lw)
            self.gpu.memory.alloc(f"act {lw.name} mb{mb}", lw.activation_bytes)
            yield from self._tp_calls("F", mb, lw)
            yield from self._ep_calls("F", mb, lw, 1)
            self._release_gathered(lw, mb, "F")
            if lw.transition_s > 0:
                yield from self.gpu.channels[Channel.TP].run(f"F{mb} {lw.name} relayout", lw.transition_s / 2)
        if self._last_chunk(chunk):
            yield from self._vocab("F", mb)
        else:
            yield from self._send("F", mb, chunk, chunk.output_message.send_bytes)

    def _backward(self, mb: int, chunk):
        """The whole backward, or under a split schedule its B: the input gradient, sent back at
        once; the weight gradients, their sync and the activations' release wait for W."""
        w, mem = self.work, self.gpu.memory
        last_mb = not self._split and self._count_backward()
        if not self._last_chunk(chunk):
            yield self.inbox["B"].get(lambda msg: msg == (mb, chunk.index))
            yield from self._gather_received("B", mb, chunk.output_message)
        else:
            yield from self._vocab("B", mb)
        layers = [w.layers[p] for p in chunk.positions]
        for pos in range(len(layers) - 1, -1, -1):
            lw = layers[pos]
            if lw.transition_s > 0:
                yield from self.gpu.channels[Channel.TP].run(f"B{mb} {lw.name} relayout", lw.transition_s / 2)
            yield from self._gathered(lw, mb, "B", layers[pos - 1] if pos > 0 else None)
            mem.alloc(f"recompute {lw.name} mb{mb}", lw.recompute_bytes)
            mem.alloc(f"buffers {lw.name} mb{mb}", lw.temporary_bytes)
            yield from self._layer_backward(mb, lw)
            yield from self._overlapped("B", mb, lw)
            # backward's collectives, plus the recomputed forward's (LayerWork.tp_recompute_calls)
            yield from self._tp_calls("B", mb, lw)
            yield from self._ep_calls("B", mb, lw, 2 if lw.strategy.recompute.reruns_forward_collectives else 1)
            mem.free(f"buffers {lw.name} mb{mb}", lw.temporary_bytes)
            mem.free(f"recompute {lw.name} mb{mb}", lw.recompute_bytes)
            mem.alloc(f"kept for W {lw.name} mb{mb}", lw.kept_for_w_bytes)
            if not self._split:
                self._layer_gradients(lw, mb, last_mb)
            self._release_gathered(lw, mb, "B")
        if not self._split:
            self._flush_gradients(mb)
        if self._vocab_leads(chunk):
            yield from self._vocab("B", mb)
        yield from self._wait_sharded_syncs()
        if not self._first_chunk(chunk):
            yield from self._send("B", mb, chunk, chunk.input_message.send_bytes)
        if last_mb:
            self._vocab_sync()

    def _weight(self, mb: int, chunk):
        """W of a split backward: the chunk's weight gradients, last layer first; then the
        micro-batch's activations go and its gradients sync as after a whole backward."""
        last_mb = self._count_backward()
        layers = [self.work.layers[p] for p in chunk.positions]
        for lw in reversed(layers):
            yield from self.gpu.compute.run(f"W{mb} {lw.name}", lw.weight_grad_s)
            self.gpu.memory.free(f"kept for W {lw.name} mb{mb}", lw.kept_for_w_bytes)
            self._layer_gradients(lw, mb, last_mb)
        self._flush_gradients(mb)
        yield from self._wait_sharded_syncs()
        if last_mb:
            self._vocab_sync()

    def _count_backward(self) -> bool:
        """Count one (weight-)gradient pass; True for the iteration's last."""
        self._backwards += 1
        return self._backwards == self.cfg.micro_batches * self.cfg.virtual_stages

    def _layer_gradients(self, lw: LayerWork, mb: int, last_mb: bool) -> None:
        """The layer's gradients of micro-batch ``mb`` are made: its activations go, its sync
        buckets fill."""
        self.gpu.memory.free(f"act {lw.name} mb{mb}", lw.activation_bytes)
        self._gradients_made(lw.name, lw.states)
        self._grads_ready(lw, mb, last_mb)

    def _flush_gradients(self, mb: int) -> None:
        """After a micro-batch's gradients: sync what the buckets hold."""
        self._flush_bucket(mb)
        for layers_, tag in self._after_backward:
            self._launch_sync(layers_, tag)
        self._after_backward = []

    def _wait_sharded_syncs(self):
        """ZeRO-3 (and ZeRO-2 with overlap_dp=False): wait for the micro-batch's reduce-scatters."""
        if self._sharded_syncs:
            # a ZeRO-3 backward ends by waiting for its reduce-scatters (FSDP's final callback):
            # the gradient buffers never pile up across micro-batches
            yield self.env.all_of(self._sharded_syncs)
            self._sharded_syncs = []

    # -- context parallelism ---------------------------------------------------------------
    def _layer_forward(self, mb: int, lw: LayerWork):
        """The layer's forward compute (less the GEMMs _overlapped plays); under cp its attention
        core runs beside the K/V exchange."""
        forward_s = lw.forward_s - self._paired_gemm_s("F", lw)
        if lw.cp is None:
            yield from self.gpu.compute.run(f"F{mb} {lw.name}", forward_s)
            return
        yield from self.gpu.compute.run(f"F{mb} {lw.name}", forward_s - lw.cp.core_fwd_s)
        yield from self._cp_attention("F", mb, lw, forward=True)

    def _layer_backward(self, mb: int, lw: LayerWork):
        """The layer's backward compute (with its recomputed forward; less W under a split
        schedule and the GEMMs _overlapped plays); under cp the recomputed core re-runs its
        forward exchange, then the backward exchange runs beside the core's backward."""
        backward_s = lw.backward_s - (lw.weight_grad_s if self._split else 0.0) - self._paired_gemm_s("B", lw)
        if lw.cp is None:
            yield from self.gpu.compute.run(f"B{mb} {lw.name}", backward_s)
            return
        rest = backward_s - lw.cp.core_bwd_s - (lw.cp.core_fwd_s if lw.cp.rerun else 0.0)
        yield from self.gpu.compute.run(f"B{mb} {lw.name}", rest)
        if lw.cp.rerun:
            yield from self._cp_attention("R", mb, lw, forward=True)
        yield from self._cp_attention("B", mb, lw, forward=False)

    def _cp_attention(self, phase: str, mb: int, lw: LayerWork, forward: bool):
        """p2p / a2a+p2p: cp blocks of the core, each beside the send of the next K/V block
        (backward: K/V and their gradients, 2 blocks) on the cp channel, the last dK/dV block
        sent home after the loop. all_gather: the exchange, then the core (backward: gather,
        core, reduce-scatter of the gradients)."""
        cp, name = lw.cp, f"{phase}{mb} {lw.name}"
        core = (cp.core_fwd_s if forward else cp.core_bwd_s) * cp.block_scale
        if cp.comm == CPComm.ALL_GATHER:
            gathered = cp.cp * cp.block_bytes
            yield from self._collective_now(Channel.CP, f"{name} cp ag", "all_gather", gathered, cp.groups)
            yield from self.gpu.compute.run(f"{name} attn", core)
            if not forward:
                yield from self._collective_now(Channel.CP, f"{name} cp rs", "reduce_scatter", gathered, cp.groups)
            return
        nbytes = cp.block_bytes * (1 if forward else 2)
        for step in range(cp.cp):
            sent = self.gpu.channels[Channel.CP].put(f"{name} cp ring {step}", self._ring_send(
                f"{name} cp ring {step}", nbytes, cp)) if step < cp.cp - 1 else None
            yield from self.gpu.compute.run(f"{name} attn {step}", core / cp.cp)
            if sent is not None:
                yield sent
        if not forward:
            yield from self.gpu.channels[Channel.CP].run(f"{name} cp dkv home", self._ring_send(
                f"{name} cp dkv home", cp.block_bytes, cp))

    def _ring_send(self, name: str, nbytes: float, cp):
        """One ring step: the rank's send to its next rank (every ring edge of the stage at once
        for a worker that stands for the stage), played as one step of a ring all-gather, as the
        cost models charge it (cost_models.context.ring_step_s)."""
        pairs = cp.ring_pairs if not self.cfg.full else tuple(p for p in cp.ring_pairs if p[0] == self.rank)
        return lambda: self.fabric.send(name, nbytes, pairs, self.cfg.full, None if self.cfg.full else self.rank,
                                        step_of="all_gather")

    def _vocab_sync(self) -> None:
        """Embedding/head gradients over their replicas; the tied embedding between the two ends
        (started by the first stage alone when one worker stands for each stage)."""
        w = self.work
        if w.vocab_grad_bytes > 0:
            self._sync.append(self._collective(Channel.DP, "vocab grad sync", "all_reduce", w.vocab_grad_bytes,
                                               w.vocab_groups))
        if w.tied_grad_bytes > 0 and (self.cfg.full or w.stage == 0):
            self._sync.append(self._collective(Channel.DP, "tied embedding sync", "all_reduce", w.tied_grad_bytes,
                                               w.tied_groups))

    def _finish(self):
        """Wait for gradient sync, step the optimizer, re-gather ZeRO-1/2 parameters."""
        for layers, tag in self._deferred:
            self._launch_sync(layers, tag)
        if self._sync:
            yield self.env.all_of(self._sync)
        update_s = self.work.vocab.update_s + sum(lw.update_s for lw in self.work.layers)
        self.optimizer_s = update_s
        yield from self.gpu.compute.run("optimizer", update_s)
        # the updated 16-bit parameters: as many bytes as the 16-bit gradient that was reduced
        gathers = [self._collective(Channel.DP, f"{part.name} param all-gather", "all_gather",
                                    part.grad_bytes, part.dp_groups)
                   for lw in self.work.layers for part in lw.parts
                   if part.dp_type in (DPType.ZERO1, DPType.ZERO2) and part.grad_bytes]
        if gathers:
            yield self.env.all_of(gathers)

    # -- pieces ----------------------------------------------------------------------------
    def _vocab(self, phase: str, mb: int):
        """Embedding/head compute; its TP traffic is the cost model's time (not played out)."""
        lt, mem = self.work.vocab, self.gpu.memory
        mem.alloc(f"vocab buffers {phase}{mb}", self.work.vocab_memory.temporary_bytes)
        yield from self.gpu.compute.run(f"{phase}{mb} vocab", lt.forward_s if phase == "F" else lt.backward_s)
        mem.free(f"vocab buffers {phase}{mb}", self.work.vocab_memory.temporary_bytes)
        if phase == "B":
            self._gradients_made("vocab", self.work.vocab_memory)
        if lt.tp_comm_s > 0:
            yield from self.gpu.channels[Channel.TP].run(f"{phase}{mb} vocab tp", lt.tp_comm_s / 2)
        act = self.work.vocab_memory.activations_bytes / self._vocab_in_flight()
        if phase == "F":
            mem.alloc(f"vocab act mb{mb}", act)
        else:
            mem.free(f"vocab act mb{mb}", act)

    def _vocab_in_flight(self) -> float:
        return max(1, in_flight(self.cfg.schedule, self.cfg.pp, self.work.stage, self.cfg.micro_batches,
                                self.cfg.virtual_stages))

    def _send(self, phase: str, mb: int, chunk, nbytes: float):
        """Blocking pipeline send (Megatron's p2p waits for the transfer) to the worker of chunk
        j + 1 (forward) or j - 1 (backward), wherever the schedule placed it; then deliver. At
        the turn of a V both chunks are on this stage: no transfer."""
        dest = chunk.index + (1 if phase == "F" else -1)
        target = self.peers[dest]
        if target.work.stage != self.work.stage:
            offset = (target.work.stage - self.work.stage) * self.per_stage
            ranks = (self.rank,) if self.cfg.full else self.work.ranks
            pairs = [(r, r + offset) for r in ranks]
            name = f"{phase}{mb} send" + (f" c{chunk.index}" if self.cfg.virtual_stages > 1 else "")
            yield from self.gpu.channels[Channel.P2P].run(
                name, lambda: self.fabric.send(name, nbytes, pairs, self.cfg.full, None if self.cfg.full else self.rank))
        target.inbox[phase].put((mb, dest))

    def _gather_received(self, phase: str, mb: int, message):
        """Megatron's scatter-gather: the received slices all-gathered over the tp group."""
        if message.gather_tp > 1:
            groups = message.gather_groups(self.work.ranks[0], self.per_stage)
            yield from self._collective_now(Channel.TP, f"{phase}{mb} recv gather", "all_gather",
                                            message.gather_bytes, groups)

    def _collective(self, channel: str, name: str, kind: str, nbytes: float,
                    groups: Sequence[Sequence[int]]) -> simpy.Event:
        """Queue a collective on one of this GPU's channels; returns its done event."""
        return self.gpu.channels[channel].put(name, self._collective_work(name, kind, nbytes, groups))

    def _collective_now(self, channel: str, name: str, kind: str, nbytes: float, groups: Sequence[Sequence[int]],
                        repeat: int = 1):
        """Generator: ``repeat`` collectives back to back on the critical path (this process waits)."""
        yield from self.gpu.channels[channel].run(name, self._collective_work(name, kind, nbytes, groups, repeat))

    def _collective_work(self, name: str, kind: str, nbytes: float, groups: Sequence[Sequence[int]],
                         repeat: int = 1):
        """What the channel runs: the play-out over all groups (one worker per stage), or the
        rank's own group once all its members have arrived (one worker per rank)."""
        if not self.cfg.full:
            return lambda: self.fabric.collective(name, kind, nbytes, groups, focus=self.rank, repeat=repeat)
        group = next(g for g in groups if self.rank in g)
        if len(group) <= 1:
            return 0.0

        def job():
            start = lambda: self.fabric.collective(name, kind, nbytes, [group], per_edge=True, repeat=repeat)
            yield self.rendezvous.arrive((name, group), len(group), start)
        return job

    # -- ZeRO-3 parameter gathers --------------------------------------------------------
    def _gathered(self, lw: LayerWork, mb: int, phase: str, upcoming: LayerWork | None):
        """Wait for ``lw``'s parameters (gathered now or prefetched) and prefetch the next layer's."""
        if lw.gathered_bytes <= 0:
            return
        event = self._issue_gather(lw, mb, phase)
        if self.cfg.prefetch and upcoming is not None and upcoming.gathered_bytes > 0:
            self._issue_gather(upcoming, mb, phase)
        yield event

    def _issue_gather(self, lw: LayerWork, mb: int, phase: str) -> simpy.Event:
        key = (phase, mb, lw.index)
        if key not in self._gathers:
            self.gpu.memory.alloc(f"gathered {lw.name} {phase}{mb}", lw.gathered_bytes)
            events = [self._collective(Channel.GATHER, f"{phase}{mb} {part.name} gather", "all_gather",
                                       part.gathered_bytes, part.dp_groups)
                      for part in lw.parts if part.gathered_bytes > 0]
            self._gathers[key] = events[0] if len(events) == 1 else self.env.all_of(events)
        return self._gathers[key]

    def _release_gathered(self, lw: LayerWork, mb: int, phase: str) -> None:
        if self._gathers.pop((phase, mb, lw.index), None) is not None:
            self.gpu.memory.free(f"gathered {lw.name} {phase}{mb}", lw.gathered_bytes)

    # -- gradient sync -----------------------------------------------------------------------
    def _grads_ready(self, lw: LayerWork, mb: int, last_mb: bool) -> None:
        """ZeRO-2/3 reduce-scatter every micro-batch (gradients are kept sharded, so the
        full gradient lives only until its bucket is reduced); DDP and ZeRO-1 accumulate
        into their persistent buffers and sync once, after the last micro-batch. Each sync part
        (the dense part, the routed experts) fills its own bucket."""
        for slot, part in enumerate(lw.parts):
            if part.grad_bytes <= 0:
                continue
            sharded = part.dp_type in (DPType.ZERO2, DPType.ZERO3)
            if not (sharded or last_mb):
                continue
            if sharded:
                self.gpu.memory.alloc(f"grad buffer {part.name} mb{mb}", part.grad_bytes)
            bucket = self._buckets[slot]
            if bucket and _sync_key(bucket[0]) != _sync_key(part):
                self._flush_bucket(mb, slot)
            self._buckets[slot].append(part)
            if sum(x.grad_bytes for x in self._buckets[slot]) >= self.cfg.bucket_bytes:
                self._flush_bucket(mb, slot)

    def _flush_bucket(self, mb: int, slot: int | None = None) -> None:
        """Sync a full bucket now (overlapped with the rest of backward), or with
        overlap_dp=False after the backward: of this micro-batch for ZeRO-2/3, of the
        iteration for DDP/ZeRO-1. ``slot`` None: every bucket."""
        for i in range(len(self._buckets)) if slot is None else (slot,):
            bucket = self._buckets[i]
            if not bucket:
                continue
            if self.cfg.overlap_dp:
                self._launch_sync(bucket, f"mb{mb}")
            elif bucket[0].dp_type in (DPType.ZERO2, DPType.ZERO3):
                self._after_backward.append((bucket, f"mb{mb}"))
            else:
                self._deferred.append((bucket, f"mb{mb}"))
            self._buckets[i] = []

    def _launch_sync(self, parts: list[SyncWork], tag: str) -> None:
        """One collective per run of parts with the same groups and kind."""
        run: list[SyncWork] = []
        for part in list(parts) + [None]:
            if run and (part is None or _sync_key(part) != _sync_key(run[0])):
                self._sync.append(self._sync_run(run, tag))
                run = []
            if part is not None:
                run.append(part)

    def _sync_run(self, run: list[SyncWork], tag: str) -> simpy.Event:
        first = run[0]
        # ZeRO-1/2/3 keep sharded optimizer states: each rank needs only its shard
        kind = "all_reduce" if first.dp_type == DPType.DDP else "reduce_scatter"
        self._syncs_launched += 1
        name = f"grad sync {run[-1].name}-{first.name} {tag} #{self._syncs_launched}"
        nbytes = sum(x.grad_bytes for x in run)
        done = self._collective(Channel.DP, name, kind, nbytes, first.dp_groups)
        if first.dp_type in (DPType.ZERO2, DPType.ZERO3):
            done.callbacks.append(lambda _e: self.gpu.memory.free(f"grad buffers {name}", nbytes))
            # nothing waits for ZeRO-2's at the backward's end: the executor waits for one only
            # when it starts the next (executor/parallel/data.py; that stall, where one outlasts
            # the next layer's backward, is not played); ZeRO-3's backward does wait (FSDP)
            if first.dp_type == DPType.ZERO3 or not self.cfg.overlap_dp:
                self._sharded_syncs.append(done)
        return done


def _sync_key(part: SyncWork) -> tuple:
    return (part.dp_groups, part.dp_type)
