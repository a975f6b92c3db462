"""python -m simulator.run: simulate one iteration of a Plan file, or of a uniform plan given
by flags, and print a summary (or one JSON record); optionally write a Perfetto trace."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

import cost_models
from cost_models.listing import cluster_lines
from specs import CPComm, CPLoadBalance, SpecError, load_cluster, load_model, model_names, uniform_plan
from specs.cli import ArgumentParser, count, dumps, output_file
from specs.embedded import plan_cluster, plan_model, read_plan
from specs.errors import one_line_errors
from specs.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_WIDTH
from specs.plan import Plan, Recompute, Schedule, SequenceParallel
from specs.schedules import upgrade_schedule
from specs.stack import STACKS

ZERO = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
LISTINGS = {"models": model_names, "clusters": cluster_lines, "cost-models": cost_models.available}
"""What --list can print."""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m simulator.run", description=__doc__)
    p.add_argument("plan", nargs="?", help="a Plan JSON file (else a uniform plan from the flags below)")
    p.add_argument("--list", choices=sorted(LISTINGS), help="print the zoo's models or clusters, or the "
                   "registered cost models, one a line, and exit")
    p.add_argument("--model", help="zoo name or Hugging Face config.json (default: the plan's)")
    p.add_argument("--cluster", help="zoo name (e.g. dgx-a100-80g:2) or cluster file (default: the plan's)")
    p.add_argument("--tp", type=count(MAX_GPUS), default=1, help="uniform plan: tensor-parallel degree")
    p.add_argument("--pp", type=count(MAX_GPUS), default=1, help="uniform plan: pipeline stages")
    p.add_argument("--dp", type=count(MAX_GPUS), default=None,
                   help="uniform plan: data-parallel degree (default: world / (tp * pp))")
    p.add_argument("--micro-batch-size", "--micro-batch", dest="micro_batch", type=count(MAX_GLOBAL_BATCH), default=1,
                   help="uniform plan: samples per micro-batch per replica")
    p.add_argument("--global-batch", type=count(MAX_GLOBAL_BATCH), default=None,
                   help="uniform plan: global batch (default: micro-batch * dp)")
    p.add_argument("--schedule", choices=[s.value for s in Schedule], default=Schedule.ONE_F_ONE_B.value, help="uniform plan: pipeline schedule")
    p.add_argument("--recompute", choices=[r.value for r in Recompute], default=Recompute.NONE.value,
                   help="uniform plan: activation recomputation")
    p.add_argument("--zero", type=count(3, minimum=0), choices=sorted(ZERO), default=0,
                   help="uniform plan: ZeRO stage (0: DDP)")
    p.add_argument("--sp", choices=[s.value for s in SequenceParallel], default=SequenceParallel.NONE.value,
                   help="uniform plan: sequence parallelism over the tp group")
    p.add_argument("--virtual-stages", type=count(MAX_GPUS), default=1,
                   help="uniform plan: model chunks per rank of --schedule interleaved_1f1b (> 1 with the "
                        "default 1f1b means interleaved_1f1b, as in plan files)")
    p.add_argument("--vocab-tp", type=count(MAX_GPUS), default=1, help="uniform plan: tp degree of the embedding and head")
    p.add_argument("--cp", type=count(MAX_GPUS), default=1,
                   help="uniform plan: context-parallel degree (the sequence split over cp ranks)")
    p.add_argument("--cp-comm", choices=[c.value for c in CPComm], default=None,
                   help="uniform plan: the cp group's K/V exchange (default: p2p, a2a+p2p beside --sp ulysses)")
    p.add_argument("--cp-load-balance", choices=[c.value for c in CPLoadBalance], default=CPLoadBalance.ZIGZAG.value,
                   help="uniform plan: token order of causal cp layers")
    p.add_argument("--seq-length", type=count(MAX_WIDTH), default=None,
                   help="train at this sequence length (default: the model's)")
    p.add_argument("--ep", type=count(MAX_GPUS), default=1,
                   help="uniform plan: expert-parallel degree of the MoE layers (experts over ep of the dp ranks)")
    p.add_argument("--cost-model", default="analytical", choices=cost_models.available(),
                   help="where compute times and memory come from")
    p.add_argument("--stack", choices=STACKS, default=None, help="for --cost-model analytical: the software whose "
                   "kernels it times (default: the plan's stated stack, else megatron-te)")
    p.add_argument("--full", action="store_true", help="play every rank (no symmetry shortcut)")
    p.add_argument("--steps", action="store_true", help="play every ring step (default for <= 64 GPUs)")
    p.add_argument("--no-overlap", action="store_true", help="sync gradients after the whole backward")
    p.add_argument("--json", action="store_true", help="print one JSON record instead of the summary")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace here")
    return p


def _uniform(args: argparse.Namespace, model, cluster) -> Plan:

    for name in ("tp", "pp", "cp", "micro_batch"):
        if getattr(args, name) <= 0:
            raise SpecError(name.replace("_", "-"), f"must be a positive integer, got {getattr(args, name)}")
    world = cluster.world_size
    split = args.tp * args.cp
    dp = args.dp if args.dp is not None else world // (split * args.pp)
    if dp <= 0 or split * args.pp * dp != world:
        cp = f"*cp({args.cp})" if args.cp > 1 else ""
        raise SpecError("dp", f"tp({args.tp}){cp}*pp({args.pp})*dp({dp}) != world({world})")
    global_batch = args.global_batch if args.global_batch is not None else args.micro_batch * dp
    if global_batch <= 0 or global_batch % (args.micro_batch * dp):
        raise SpecError("global-batch", f"{global_batch} is not a positive multiple of micro-batch("
                        f"{args.micro_batch})*dp({dp}) = {args.micro_batch * dp}")
    if args.zero and dp * args.cp == 1:
        raise SpecError("zero", f"ZeRO-{args.zero} needs dp > 1 or cp > 1 (both are 1)")
    cp_comm = args.cp_comm or (CPComm.A2A_P2P if args.cp > 1 and args.sp == SequenceParallel.ULYSSES else CPComm.P2P)
    plan = uniform_plan(model.num_layers, tp=args.tp, dp=dp, pp=args.pp, global_batch=global_batch,
                        micro_batches=global_batch // (args.micro_batch * dp), dp_type=ZERO[args.zero],
                        recompute=args.recompute, sp=args.sp, vocab_tp=args.vocab_tp, model=str(args.model),
                        cp=args.cp, cp_comm=cp_comm, cp_load_balance=args.cp_load_balance,
                        cluster=str(args.cluster),
                        **upgrade_schedule({"schedule": args.schedule, "virtual_stages": args.virtual_stages}))
    if args.ep == 1:
        return plan
    if all(layer.moe is None for layer in model.layers):
        raise SpecError("ep", f"--ep {args.ep} needs a model with MoE layers; {model.name} has none")
    return replace(plan, layers=tuple(replace(s, ep=args.ep) if layer.moe is not None else s
                                      for layer, s in zip(model.layers, plan.layers)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from simulator import simulate
    output_file(args.trace, "--trace")  # before the work, not after it
    world = load_cluster(args.cluster).world_size if args.cluster else None  # sets a Galvatron file's dp
    plan = read_plan(args.plan, world) if args.plan else None
    if plan is None and not (args.model and args.cluster):
        raise SpecError("model" if not args.model else "cluster", "give --model and --cluster "
                        "(or a plan file that names or embeds them)")
    model_name, cluster_name = args.model, args.cluster
    model = plan_model(plan, args.model) if plan else load_model(args.model)
    cluster = plan_cluster(plan, args.cluster) if plan else load_cluster(args.cluster)
    if args.seq_length is not None:
        model = model.with_seq_len(args.seq_length)
    if plan is None:
        args.model, args.cluster = model_name, cluster_name
        plan = _uniform(args, model, cluster)
    cm = cost_models.get(args.cost_model, cluster, **_stack_option(args, plan))
    coalesce = False if args.steps else None  # None: simulate() decides by world size
    result = simulate(model, cluster, plan, cm, full=args.full, trace_path=args.trace,
                      overlap_dp=not args.no_overlap, coalesce_steps=coalesce)
    record = {"model": model.name, "cluster": cluster.name, "plan": plan.summary(), **result.to_record()}
    if result.oom is not None:  # the iteration never finished: it has no time or throughput
        record.update(feasible=False, iteration_time_s=None, throughput_samples_per_s=None)
    if not args.json:
        print(f"{model.name} on {cluster.name}: {plan.summary()}")
        print(result.summary() if result.oom is None else f"OOM: {result.oom} (no iteration time or throughput)")
        if args.trace:
            print(f"trace            {args.trace} (open in https://ui.perfetto.dev)")
    return record


def _stack_option(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """The analytical model's software stack: --stack, else the plan's stated one ({}: its default)."""
    stack = args.stack or plan.stack
    if args.stack is not None and args.cost_model != "analytical":
        raise SpecError("--stack", f"the software stack is the analytical model's (--cost-model {args.cost_model} "
                        "times what its profile ran)")
    return {"stack": stack} if stack is not None and args.cost_model == "analytical" else {}


@one_line_errors()
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        print("\n".join(LISTINGS[args.list]()))
        return 0
    record = run(args)
    if args.json:
        print(dumps(record))
    return 0 if record["oom"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
