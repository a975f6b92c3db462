"""Plans each framework can express, shared by the round-trip and the library tests."""
from __future__ import annotations

from dataclasses import replace

from frameworks.base import schedule_fields
from specs import ClusterSpec, ModelSpec, Plan, load_cluster, load_model, uniform_plan


def llama() -> tuple[ModelSpec, ClusterSpec]:
    return load_model("llama3-70b"), load_cluster("dgx-h100:8")


def plan(model: ModelSpec, cluster: ClusterSpec, *, vocab_zero3: bool = False, virtual_stages: int = 1,
         stage_layers: tuple[int, ...] | None = None, **kw) -> Plan:
    schedule = kw.pop("schedule", "1f1b")  # a many-chunk schedule is set with its virtual stages below
    p = uniform_plan(model.num_layers, schedule=schedule if virtual_stages == 1 else "1f1b", **kw)
    sp = p.layers[0].sp
    p = replace(p, vocab_tp=p.layers[0].degrees.split // p.layers[0].cp, vocab_sp=sp, vocab_zero3=vocab_zero3, **schedule_fields(schedule, virtual_stages),
                model=model.name, cluster=cluster.name, stage_layers=stage_layers or p.stage_layers)
    p.validate(model, cluster)
    return p


def expressible(target: str) -> list[Plan]:
    """Plans ``target`` runs, over its degrees, schedules, recompute modes and dp flavours."""
    m, c = llama()
    cases = {
        "megatron": [
            plan(m, c, tp=8, dp=2, pp=4, global_batch=64, micro_batches=8, sp="megatron", recompute="selective",
                 dp_type="zero1"),
            plan(m, c, tp=4, dp=4, pp=4, global_batch=128, micro_batches=16, sp="megatron", recompute="full",
                 virtual_stages=4),
            plan(m, c, tp=8, dp=1, pp=8, global_batch=32, micro_batches=32, stage_layers=(8, 11, 11, 11, 11, 11, 11, 6)),
            plan(m, c, tp=2, dp=32, pp=1, global_batch=64, micro_batches=2, dp_type="zero1"),
            plan(m, c, tp=8, cp=4, dp=2, pp=1, global_batch=16, micro_batches=8, sp="megatron", dp_type="zero1"),
            plan(m, c, tp=4, cp=4, dp=1, pp=4, global_batch=16, micro_batches=16, cp_comm="all_gather",
                 dp_type="zero1", recompute="selective"),
            plan(m, c, tp=4, dp=8, pp=2, global_batch=64, micro_batches=8, sp="megatron", dp_type="zero1",
                 stack="megatron-te", tp_comm_overlap=True),
        ],
        "torchtitan": [
            plan(m, c, tp=8, dp=8, global_batch=64, micro_batches=2, sp="megatron", recompute="full",
                 dp_type="zero3", vocab_zero3=True),
            plan(m, c, tp=4, dp=4, pp=4, global_batch=64, micro_batches=8, sp="megatron", dp_type="zero2",
                 virtual_stages=2),
            plan(m, c, tp=8, dp=4, pp=2, global_batch=32, micro_batches=4, schedule="gpipe", recompute="full"),
            plan(m, c, tp=2, dp=32, global_batch=64, micro_batches=1, sp="megatron", recompute="selective-op",
                 dp_type="zero3", vocab_zero3=True),
            plan(m, c, tp=8, dp=8, global_batch=64, micro_batches=2, sp="megatron", recompute="full",
                 dp_type="zero3", vocab_zero3=True, stack="compile", tp_comm_overlap=True),
        ],
        "deepspeed": [
            plan(m, c, tp=1, dp=16, pp=4, global_batch=64, micro_batches=4, recompute="full", dp_type="zero1"),
            plan(m, c, ulysses=8, dp=8, global_batch=64, micro_batches=8, sp="ulysses", dp_type="zero3", vocab_zero3=True),
            plan(m, c, tp=4, dp=16, global_batch=64, micro_batches=2, sp="megatron", dp_type="zero2"),
        ],
    }
    return cases[target]
