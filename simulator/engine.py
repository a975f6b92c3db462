"""simulate(): build the GPUs, links and per-stage programs of a plan, play one iteration, report.

With ``full=False`` (the default) one worker per pipeline stage stands for all its ranks:
every rank of a stage runs the same program, so one representative plays it and its
collectives move bundles standing for every group of the stage (same link loads).
``full=True`` plays every rank, each collective group meeting at a rendezvous.
"""
from __future__ import annotations

from pathlib import Path

import simpy

from cost_models import CostModel
from simulator.collectives import Fabric, LinkCalibration, Rendezvous
from simulator.hardware import GPU, Channel, Contention, Recorder, union_length
from simulator.network import Network
from simulator.result import SimResult
from simulator.trace import resource_name, write_trace
from simulator.work import build_stages
from simulator.worker import Worker, WorkerConfig
from specs import ClusterSpec, ModelSpec, Plan
from specs.capabilities import Capabilities, check_supported
from specs.schedules import REGISTRY
from specs.limits import made_time
from specs.units import GIB


AUTO_COALESCE_GPUS = 64
"""Above this world size, collectives are played as one flow each unless asked otherwise."""


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes."""

    def __init__(self) -> None:
        super().__init__()
        self.processed = 0

    def step(self) -> None:
        self.processed += 1
        super().step()


CAPABILITIES = Capabilities(schedule=frozenset(REGISTRY))
"""The simulator plays every registered schedule (specs.schedules gives each stage's op order); every other axis value runs (its costs come from the cost model, which checks its own)."""


def simulate(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost_model: CostModel | None = None, *,
             full: bool = False, trace_path: str | Path | None = None, record_memory: bool = True,
             overlap_dp: bool = True, bucket_bytes: float | None = None, prefetch: bool = True,
             coalesce_steps: bool | None = None, keep_spans: bool = False) -> SimResult:
    """Play one training iteration of ``plan``; compute times and byte sizes from ``cost_model``
    (default: the analytical model of ``cluster``), communication over ``cluster``'s links.

    overlap_dp=False defers gradient sync to after the last backward (the cost-model
    formula's assumption); bucket_bytes: gradient bytes synced together (default: the cost
    model's sync_bucket_bytes); coalesce_steps plays each collective as one flow instead of
    its ring steps (default: only above AUTO_COALESCE_GPUS GPUs); keep_spans keeps every
    (gpu, stream, name, start, end) in the result.
    """
    plan.validate(model, cluster)
    check_supported(plan, model, CAPABILITIES, "simulator")
    if cost_model is None:
        import cost_models
        cost_model = cost_models.get("analytical", cluster)
    check_supported(plan, model, cost_model.capabilities, f"{cost_model.name} cost model")  # it times every op
    stages = build_stages(model, cluster, plan, cost_model)
    if coalesce_steps is None:
        coalesce_steps = cluster.world_size > AUTO_COALESCE_GPUS
    env = CountingEnvironment()
    recorder = Recorder(enabled=keep_spans or trace_path is not None)
    flows: list = []
    network = Network(env, {}, record=trace_path is not None,
                      on_flow_end=flows.append if trace_path is not None else None)
    fabric = Fabric(env, cluster, network, coalesce_steps, LinkCalibration.from_cost_model(cost_model))
    config = WorkerConfig(schedule=plan.schedule, pp=plan.pp, micro_batches=plan.micro_batches, full=full,
                          virtual_stages=plan.virtual_stages,
                          overlap_dp=overlap_dp, prefetch=prefetch,
                          bucket_bytes=cost_model.sync_bucket_bytes if bucket_bytes is None else bucket_bytes,
                          lazy_gradients=cost_model.lazy_gradients)
    capacity = cluster.gpu.memory_gib * GIB
    rendezvous = Rendezvous(env) if full else None
    workers = []
    for st in stages:
        ranks = st.ranks if full else st.ranks[:1]
        workers.append([Worker(env, st, GPU(env, r, capacity, recorder, record_memory,
                                            contention=_contention(env, network, fabric.cal, r)),
                               fabric, config, rendezvous)
                        for r in ranks])
    if not full:
        fabric.focus_ranks.update(w.rank for ws in workers for w in ws)
    _wire(workers, plan)
    env.run()
    flat = [w for ws in workers for w in ws]
    stuck = [w.rank for w in flat if not w.action.triggered]
    if stuck:
        raise RuntimeError(f"simulation deadlocked: ranks {stuck[:8]} did not finish their iteration")
    if trace_path is not None:
        stands_for = None if full else {f"GPU {w.rank}": w.work.ranks for ws in workers for w in ws}
        write_trace(trace_path, recorder.spans, flows, stands_for)
    exact = None if full else fabric.exact_resources
    return _result(plan, cluster, workers, network, env, capacity, recorder, full, exact)


def _contention(env: simpy.Environment, network: Network, cal: LinkCalibration, rank: int) -> Contention | None:
    """Compute and data-parallel traffic slowing each other on ``rank`` (the cost model's
    overlap coefficient; none at 1): its own ports are the links that slow."""
    if cal.overlap_coefficient <= 1.0:
        return None
    ports = (("gpu_out", rank), ("gpu_in", rank))
    return Contention(env, cal.overlap_coefficient, lambda factor: network.scale(ports, factor))


def _wire(workers: list[list[Worker]], plan: Plan) -> None:
    """Each worker sends chunk j's output to the worker of chunk j + 1 and its input gradient to
    that of chunk j - 1: the same position in the stage the schedule placed that chunk on."""
    for stage_workers in workers:
        for i, worker in enumerate(stage_workers):
            worker.peers = {j: workers[plan.chunk_stage(j)][i] for j in range(plan.pp * plan.virtual_stages)}


def _result(plan: Plan, cluster: ClusterSpec, workers: list[list[Worker]], network: Network,
            env: CountingEnvironment, capacity: float, recorder: Recorder, full: bool,
            exact: set | None) -> SimResult:
    flat = [w for ws in workers for w in ws]
    total = made_time(max(w.end_s for w in flat), "iteration_time_s", "the simulated iteration time")
    per_rank = {}
    for w in flat:
        for r in ((w.rank,) if full else w.work.ranks):
            per_rank[r] = w
    ordered = [per_rank[r] for r in range(cluster.world_size)]
    ooms = [w.gpu.memory.oom for w in flat if w.gpu.memory.oom is not None]
    # links that carried traffic (with the symmetry shortcut: those of the played-out ranks,
    # whose symmetric copies carry the same)
    links = {resource_name(res): carried / (network.base_capacity[res] * total) if total > 0 else 0.0
             for res, carried in network.carried_bytes.items() if carried > 0 and (exact is None or res in exact)}
    return SimResult(
        iteration_time_s=total,
        throughput_samples_per_s=plan.global_batch / total if total > 0 else float("inf"),
        peak_memory_bytes=tuple(w.gpu.memory.peak_bytes for w in ordered),
        capacity_bytes=capacity,
        oom=min(ooms, key=lambda o: (o.time_s, o.gpu)) if ooms else None,
        bubble_fraction=_mean(ordered, lambda w: 1.0 - _pipeline_busy(w) / total),
        compute_busy_fraction=_mean(ordered, lambda w: w.gpu.compute.busy_s / total),
        comm_busy_fraction=_mean(ordered, lambda w: union_length(w.gpu.comm_intervals()) / total),
        link_utilisation=links,
        memory_timeline=tuple(tuple(w.gpu.memory.timeline) for w in ordered),
        events=env.processed,
        simulated_gpus=len(flat),
        stage_end_s=tuple(max(w.end_s for w in ws) for ws in workers),
        spans=tuple(recorder.spans),
    )


def _pipeline_busy(w: Worker) -> float:
    """Time on per-micro-batch work: compute (less the optimizer step), TP collectives, sends."""
    gpu = w.gpu
    intervals = sorted(gpu.compute.intervals + gpu.channels[Channel.TP].intervals + gpu.channels[Channel.P2P].intervals)
    return union_length(intervals) - w.optimizer_s


def _mean(items, fn) -> float:
    return sum(fn(x) for x in items) / len(items) if items else 0.0
