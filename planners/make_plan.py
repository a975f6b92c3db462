"""python -m planners.make_plan: write a self-contained plan file from Megatron-LM's degree flags
(or from a Galvatron plan file), score it with the cost model, and optionally export it as a
Galvatron plan file."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import cost_models
from specs import Plan, SpecError, load_cluster, load_model, save_galvatron_plan, uniform_plan
from specs.cli import ArgumentParser, count, output_file
from specs.embedded import read_plan, with_specs
from specs.errors import one_line_errors
from specs.flops import throughput
from specs.limits import MAX_GLOBAL_BATCH, MAX_GPUS
from specs.model import ATTENTION_KINDS


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m planners.make_plan", description=__doc__)
    p.add_argument("--model", required=True, help="zoo model name or a config.json path")
    p.add_argument("--cluster", required=True, help="zoo cluster name (name:nodes) or a cluster file")
    p.add_argument("--seq-length", type=count(1 << 24), help="train at this sequence length (default: the model's)")
    p.add_argument("--attention", choices=ATTENTION_KINDS, help="how attention is computed (default: the config's)")
    p.add_argument("--tensor-model-parallel-size", type=count(MAX_GPUS), default=1, help="tp degree")
    p.add_argument("--pipeline-model-parallel-size", type=count(MAX_GPUS), default=1, help="pipeline stages")
    p.add_argument("--num-layers-per-virtual-pipeline-stage", type=count(1 << 16),
                   help="interleaved 1F1B: layers per model chunk (default: no interleaving)")
    p.add_argument("--micro-batch-size", type=count(MAX_GLOBAL_BATCH), default=1,
                   help="samples per micro-batch per data-parallel replica")
    p.add_argument("--global-batch-size", type=count(MAX_GLOBAL_BATCH),
                   help="samples per iteration (default: micro-batch size x data-parallel degree)")
    p.add_argument("--use-distributed-optimizer", action="store_true", help="shard the optimizer states (ZeRO-1)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism over tp")
    p.add_argument("--recompute-granularity", choices=("full", "selective"), help="activation recomputation")
    p.add_argument("--from-galvatron", type=Path, help="read this Galvatron plan file instead of the degree flags")
    p.add_argument("--to-galvatron", type=Path, help="also write the plan as a Galvatron plan file here")
    p.add_argument("--out", type=Path, help="write the plan (model and cluster embedded) here")
    return p


def plan_from_degrees(args: argparse.Namespace, num_layers: int, world: int) -> Plan:
    """Megatron's flags as a uniform Plan (the vocabulary split over tp, as Megatron splits it)."""
    tp, pp, mbs = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.micro_batch_size
    if world % (tp * pp):
        raise SpecError("tensor-model-parallel-size", f"tp({tp})*pp({pp}) = {tp * pp} does not divide {world} GPUs")
    dp = world // (tp * pp)
    gbs = args.global_batch_size or mbs * dp
    if gbs % (mbs * dp):
        raise SpecError("global-batch-size", f"{gbs} is not a multiple of micro-batch-size({mbs})*dp({dp}) = {mbs * dp}")
    chunk = args.num_layers_per_virtual_pipeline_stage
    if chunk and num_layers % (pp * chunk):
        raise SpecError("num-layers-per-virtual-pipeline-stage", f"{num_layers} layers / (pp {pp} * {chunk})")
    return uniform_plan(num_layers, tp=tp, dp=dp, pp=pp, global_batch=gbs, micro_batches=gbs // (mbs * dp),
                        dp_type="zero1" if args.use_distributed_optimizer and dp > 1 else "ddp",
                        recompute=args.recompute_granularity or "none",
                        sp="megatron" if args.sequence_parallel else "none",
                        virtual_stages=num_layers // (pp * chunk) if chunk else 1, vocab_tp=tp,
                        model=args.model, cluster=args.cluster)


@one_line_errors()
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    output_file(args.out, "--out")
    output_file(args.to_galvatron, "--to-galvatron")
    model, cluster = load_model(args.model), load_cluster(args.cluster)
    model = model.with_seq_len(args.seq_length) if args.seq_length else model
    model = model.with_attention(args.attention) if args.attention else model
    if args.from_galvatron:
        plan = read_plan(args.from_galvatron, cluster.world_size)
    else:
        plan = plan_from_degrees(args, model.num_layers, cluster.world_size)
    plan.validate(model, cluster)
    plan = with_specs(plan, model, cluster)
    cost = cost_models.get("analytical", cluster).plan_cost(model, plan)
    fig = throughput(model, cluster, plan.global_batch, cost.iteration_time_s)
    print(f"{model.name} (seq {model.seq_len}) on {cluster.name}: {plan.summary()}")
    print(f"cost model: {cost.iteration_time_s * 1e3:.1f} ms, {fig.tokens_per_s_per_gpu:.0f} tokens/s/GPU, "
          f"{fig.tflops_per_gpu:.1f} TFLOP/s/GPU, MFU {fig.mfu:.1%}, peak {cost.peak_memory_bytes / 2**30:.2f} GiB")
    if args.out:
        plan.save(args.out)
        print(f"plan: {args.out}")
    if args.to_galvatron:
        save_galvatron_plan(plan, args.to_galvatron)
        print(f"galvatron plan: {args.to_galvatron}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
