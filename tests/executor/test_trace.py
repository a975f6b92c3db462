"""--check's model-parallel collective trace (executor.trace) against the cost model's rows as the
executor runs them (cost_models.expected_collectives): tp, Megatron-SP, Ulysses, the cp ring, a
pipeline with a tied embedding, expert parallelism, relayouts and vocabulary parallelism on 2 gloo
ranks pass; an executor that runs other collectives (same numbers), skips one or sends it
mis-sized fails with a line naming the layer, the kind and both sides' numbers."""
import json
from functools import partial

import pytest
import torch
import torch.distributed as dist

import cost_models
import specs
from executor import train
from executor.execution import CostPrediction, model_parallel_errors
from executor.parallel import checkpoint, expert, relayout, sequence, tensor
from executor.run import run_plan
from specs import LayerStrategy as L
from specs import Plan, uniform_plan
from tests.executor import broken_workers

def _two_layers(model, layers, micro_batches=1, **kwargs):
    return Plan(pp=1, stage_layers=(2,), layers=tuple(layers), model=model, micro_batches=micro_batches, **kwargs)


PLANS = {
    # name: (model, plan kwargs or plan)
    "tp2": ("tiny-llama", dict(global_batch=4, micro_batches=2, tp=2)),
    "tp2_sp": ("tiny-gpt", dict(global_batch=4, micro_batches=2, tp=2, sp="megatron")),
    "tp2_sp_selective": ("tiny-gpt", dict(global_batch=4, micro_batches=2, tp=2, sp="megatron",
                                          recompute="selective")),
    # torchtitan's per-op policy: the all-gathers and the first all-reduce re-run, no reduce-scatter
    "tp2_selective_op": ("tiny-llama", dict(global_batch=4, micro_batches=2, tp=2, recompute="selective-op")),
    "tp2_sp_selective_op": ("tiny-llama", dict(global_batch=4, micro_batches=2, tp=2, sp="megatron",
                                               recompute="selective-op")),
    "ulysses2": ("tiny-gpt", dict(global_batch=2, ulysses=2, sp="ulysses")),
    "cp2_ring": ("tiny-gpt", dict(global_batch=2, cp=2)),
    "pp2": ("tiny-gpt", dict(global_batch=4, micro_batches=2, pp=2)),  # tied: the ends' sync too
    "ep2": ("tiny-moe", _two_layers("tiny-moe", [L(dp=2, ep=2), L(dp=2, ep=2, recompute="full")], global_batch=4,
                                    micro_batches=2)),
    "moe_tp2": ("tiny-moe", _two_layers("tiny-moe", [L(tp=2)] * 2, global_batch=4)),
    "relayout": ("tiny-gpt", _two_layers("tiny-gpt", [L(tp=2), L(dp=2)], global_batch=4, micro_batches=2)),
    "vocab_tp2": ("tiny-gpt", _two_layers("tiny-gpt", [L(dp=2)] * 2, global_batch=4, vocab_tp=2)),
    "vocab_sp": ("tiny-gpt", _two_layers("tiny-gpt", [L(tp=2)] * 2, global_batch=4, micro_batches=2, vocab_tp=2,
                                         vocab_sp="megatron")),
    "vocab_ulysses": ("tiny-gpt", _two_layers("tiny-gpt", [L(dp=2)] * 2, global_batch=4, vocab_tp=2,
                                              vocab_sp="ulysses")),
}
SLOW = {"cp2_ring", "pp2", "moe_tp2", "vocab_ulysses"}


def _model_plan(name):
    model_name, plan = PLANS[name]
    model = specs.load_model(model_name).scaled(num_layers=2)
    return model, plan if isinstance(plan, Plan) else uniform_plan(2, model=model_name, **plan)


def _run(model, plan, rank_fn=train.worker):
    prediction = CostPrediction(collectives=tuple(cost_models.expected_collectives(model, plan, 2)))
    return run_plan(plan, model, world_size=2, steps=2, check=True, track_memory=False, timeout_s=180,
                    prediction=prediction, rank_fn=rank_fn)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in PLANS])
def test_model_parallel_collectives_are_those_charged(name):
    model, plan = _model_plan(name)
    m = _run(model, plan)
    assert m.check.passed, (m.check.collective_errors, m.check.worst)


def tp_input_all_reduced_per_projection(rank, world_size, model, plan, cfg):
    """tp without Megatron's f at the sub-layer's entry: q, k and v (gate and up) each all-reduce
    their input's gradient (same numbers, 3 + 2 backward all-reduces per block instead of 2)."""
    real = tensor.tp_plan

    def tp_plan(block, sequence_parallel=False):
        styles = real(block, sequence_parallel)
        return styles if sequence_parallel else {k: v for k, v in styles.items() if k not in ("attn", "mlp")}
    tensor.tp_plan = tp_plan
    return train.worker(rank, world_size, model, plan, cfg)


def ulysses_without_all_to_all(rank, world_size, model, plan, cfg):
    """Ulysses' exchange done by an all-gather of every rank's send buffer, each rank keeping its
    slot of each (the same numbers, no all-to-all)."""
    def exchange(x, group):
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.stack([p[dist.get_rank(group)] for p in parts])

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return exchange(x, group)

        @staticmethod
        def backward(ctx, grad):
            return exchange(grad, ctx.group), None
    sequence._AllToAll = AllToAll
    return train.worker(rank, world_size, model, plan, cfg)


def expert_all_to_all_by_send_recv(rank, world_size, model, plan, cfg):
    """Expert parallelism's token exchange over 2 ranks done by a send and a receive of the
    rows for the peer (the same numbers, no all-to-all)."""
    def exchange(x, out_splits, in_splits, group):
        me = dist.get_rank(group)
        mine, theirs = x.split(in_splits)[me], x.split(in_splits)[1 - me].contiguous()
        got = x.new_empty((out_splits[1 - me], *x.shape[1:]))
        peer = dist.get_global_rank(group, 1 - me)
        if me == 0:
            dist.send(theirs, peer)
            dist.recv(got, peer)
        else:
            dist.recv(got, peer)
            dist.send(theirs, peer)
        return torch.cat([mine, got] if me == 0 else [got, mine])

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, out_splits, in_splits, group):
            ctx.args = (in_splits, out_splits, group)
            return exchange(x, out_splits, in_splits, group)

        @staticmethod
        def backward(ctx, grad):
            return AllToAll.apply(grad, *ctx.args), None, None, None
    expert._AllToAll = AllToAll
    return train.worker(rank, world_size, model, plan, cfg)


def expert_rows_padded(rank, world_size, model, plan, cfg):
    """The dispatch and combine send each row padded to twice its width (zeros; cut off on
    arrival): the same numbers, all-to-alls of twice the elements."""
    real = expert._AllToAll

    class Padded:
        @staticmethod
        def apply(x, out_splits, in_splits, group):
            return real.apply(torch.cat([x, torch.zeros_like(x)], dim=1), out_splits, in_splits, group)[:, :x.shape[1]]
    expert._AllToAll = Padded
    return train.worker(rank, world_size, model, plan, cfg)


def relayout_by_all_reduce(rank, world_size, model, plan, cfg):
    """Relayouts rebuild the micro-batch by an all-reduce of zero-padded slices (one copy of
    each slice, the same numbers, no all-gather)."""
    def gather_slices(x, layout, group):
        me = dist.get_rank(group)
        parts = x.new_zeros((layout.dp, *x.shape))
        if layout.local_rank(layout.dp_index(me), 0) == me:
            parts[layout.dp_index(me)] = x
        dist.all_reduce(parts, group=group)
        return torch.cat(list(parts), dim=0)
    relayout._gather_slices = gather_slices
    return train.worker(rank, world_size, model, plan, cfg)


def sp_gather_recomputed(rank, world_size, model, plan, cfg):
    """Selective recomputation with Megatron-SP's attention all-gather inside the checkpointed
    region and not kept by the policy: backward re-runs the gather (same numbers, one more
    all-gather per block and micro-batch)."""
    checkpoint._hoist_pre_hooks = lambda inner, outer: None
    checkpoint.SAVED_NAMESPACES = frozenset()
    return train.worker(rank, world_size, model, plan, cfg)


def reduce_scatter_recomputed(rank, world_size, model, plan, cfg):
    """torchtitan's per-op policy without the reduce-scatters in its save list: the recomputed
    forward re-runs the attention's (the MLP's is after the last tensor backward needs: early stop)."""
    checkpoint.KEPT_REDUCE_SCATTER = None
    return train.worker(rank, world_size, model, plan, cfg)


def tied_sync_skipped(rank, world_size, model, plan, cfg):
    """The tied embedding's bucket keeps each end's own gradient (no all-reduce between the ends)."""
    broken_workers.skip_sync("tied embedding")
    return train.worker(rank, world_size, model, plan, cfg)


@pytest.mark.parametrize("fault, name, line", [
    (expert_all_to_all_by_send_recv, "ep2",
     # dispatch and combine, forward and backward (and layer 1's full recompute), 2 micro-batches
     "layer 0 experts (rank 0): all_to_all ran none; the cost model charges x8 over 2 ranks"),
    (expert_rows_padded, "ep2",
     # 2 micro-batches of one sequence per rank: 64 tokens x 2 copies x 128 = 16384 per call, 8 calls
     # per rank, 262144 on the 2 ranks; forward's sends padded to twice, backward's (whose gradients
     # go through the padding's cut and the padded exchange again) to four times the width: 3x
     "layer 0 experts (2 ranks): all_to_all moved 786432 elements in all; the cost model charges 262144 (routed "
     "rows, compared as the ranks' total)"),
    (relayout_by_all_reduce, "relayout",
     # tp 2 -> dp 2, 2 micro-batches of 2: the activation (16384) gathered to 32768 in forward, its
     # gradient (8192 per rank) to 16384 in backward
     "relayout 1 (rank 0): all_gather ran none; the cost model charges x2 of 16384 elements over 2 ranks, x2 of "
     "32768 elements over 2 ranks (as the executor runs it: relayout gathers every slice over the stage)"),

    (tp_input_all_reduced_per_projection, "tp2",
     # 2 micro-batches of 2: 2 * 64 * 128 = 16384 elements; forward 2, backward 3 + 2, per micro-batch
     "layer 0 (rank 0): all_reduce ran x14 of 16384 elements over 2 ranks; the cost model charges x8 of 16384 "
     "elements over 2 ranks"),
    (sp_gather_recomputed, "tp2_sp_selective",
     # 2 micro-batches of 2: 2 * 64 * 128 = 16384 elements gathered. Layer 1 (the last) gathers
     # forward 2 + its output 1, backward 2, per micro-batch: 10, and 2 more from the recomputed
     # attention gathers
     "layer 1 (rank 0): all_gather ran x12 of 16384 elements over 2 ranks; the cost model charges x10 of 16384 "
     "elements over 2 ranks (as the executor runs it: sequence gathered where the split ends)"),
    (reduce_scatter_recomputed, "tp2_sp_selective_op",
     # 2 micro-batches of 2: 16384 elements; forward 2 and backward 2 per micro-batch (8), and the
     # attention's again in each recomputed forward (2 more)
     "layer 0 (rank 0): reduce_scatter ran x10 of 16384 elements over 2 ranks; the cost model charges x8 of 16384 "
     "elements over 2 ranks"),
    (ulysses_without_all_to_all, "ulysses2",
     "layer 1 (rank 1): all_to_all ran none; the cost model charges x2 of 8192 elements over 2 ranks, x2 of 24576 "
     "elements over 2 ranks"),
])
def test_other_collectives_fail_the_check(fault, name, line):
    model, plan = _model_plan(name)
    m = _run(model, plan, rank_fn=fault)
    c = m.check
    assert max(c.loss_max_abs_diff, c.grad_max_abs_diff, c.param_max_abs_diff) <= c.atol  # the numbers are right
    assert not c.passed and line in c.collective_errors, c.collective_errors


class Row:
    def __init__(self, layer, part, op, elements, calls, size=2, difference=""):
        self.layer, self.part, self.op, self.elements, self.calls = layer, part, op, elements, calls
        self.group_size, self.difference = size, difference


def test_model_parallel_errors_by_hand():
    charged = (Row(0, "model_parallel", "all_reduce", 100, 2), Row(1, "pipeline", "send", 50, 1, difference="why"),
               Row(0, "dense", "all_reduce", 999, 1), Row(0, "expert_dispatch", "all_to_all", 10, 2))
    ran = {"layer 0": [("all_reduce", 100, 2)] * 2, "boundary 1": [("send", 50, 2)], "outside layers": [("x", 1, 2)],
           "layer 0 experts": [("all_to_all", 7, 2), ("all_to_all", 13, 2)]}
    assert model_parallel_errors([{"model_parallel": ran}], charged) == []
    # routed rows: per rank the calls, over the ranks the elements in total (7 + 13 + 9 + 11 = 4 x 10)
    other = dict(ran, **{"layer 0 experts": [("all_to_all", 9, 2), ("all_to_all", 11, 2)]})
    assert model_parallel_errors([{"model_parallel": ran}, {"model_parallel": other}], charged) == []
    other["layer 0 experts"] = [("all_to_all", 9, 2), ("all_to_all", 31, 2)]
    assert model_parallel_errors([{"model_parallel": ran}, {"model_parallel": other}], charged) == [
        "layer 0 experts (2 ranks): all_to_all moved 60 elements in all; the cost model charges 40 (routed rows, "
        "compared as the ranks' total)"]
    other["layer 0 experts"] = [("all_to_all", 9, 2)]
    assert model_parallel_errors([{"model_parallel": ran}, {"model_parallel": other}], charged) == [
        "layer 0 experts (rank 1): all_to_all ran x1 over 2 ranks; the cost model charges x2 over 2 ranks"]
    ran["boundary 1"] = [("send", 50, 2), ("recv", 50, 2)]
    ran["layer 0"] = [("all_reduce", 100, 2), ("all_reduce", 100, 4)]
    assert model_parallel_errors([{"model_parallel": ran}], charged) == [
        "layer 0 (rank 0): all_reduce ran x1 of 100 elements over 2 ranks, x1 of 100 elements over 4 ranks; the cost "
        "model charges x2 of 100 elements over 2 ranks",
        "boundary 1 (rank 0): recv ran x1 of 50 elements over 2 ranks; the cost model charges none"]


def worker_saving_trace(directory, rank, world_size, model, plan, cfg):
    """train.worker that also writes its rank's model-parallel trace to ``directory``/rank<r>.json."""
    result = train.worker(rank, world_size, model, plan, cfg)
    (directory / f"rank{rank}.json").write_text(json.dumps(result["model_parallel"]))
    return result


def test_megatron_sp_keeps_the_sequence_split_between_blocks(tmp_path):
    # tp 2 + Megatron-SP, 4 layers, 2 micro-batches of 2 sequences: 2 * 64 * 128 = 16384 elements per
    # gather. Inside a block SP all-gathers before attention and MLP in forward, and the gradients
    # of both sub-layers' reduce-scatters in backward: 4 per micro-batch. The first block also
    # gathers its input's gradient, the last its output, one each per micro-batch; the interior
    # blocks hand the residual stream on split (before: 2 more gathers per block and micro-batch)
    model = specs.load_model("tiny-gpt").scaled(num_layers=4)
    plan = uniform_plan(4, model="tiny-gpt", global_batch=4, micro_batches=2, tp=2, sp="megatron")
    m = _run(model, plan, rank_fn=partial(worker_saving_trace, tmp_path))
    assert m.check.passed, (m.check.collective_errors, m.check.worst)
    for rank in range(2):
        trace = json.loads((tmp_path / f"rank{rank}.json").read_text())
        gathers = [trace[f"layer {i}"].count(["all_gather", 16384, 2]) for i in range(4)]
        assert gathers == [10, 8, 8, 10], (rank, gathers)


def test_a_skipped_tied_embedding_sync_fails_the_check():
    # pp 2, one rank per stage: the tied matrix (512 x 128) is the ends' one all-reduce
    model, plan = _model_plan("pp2")
    m = _run(model, plan, rank_fn=tied_sync_skipped)
    line = "tied embedding (rank 1): ran none; the cost model charges all_reduce x1 of 65536 elements over 2 ranks"
    assert not m.check.passed and line in m.check.collective_errors, m.check.collective_errors


def test_selective_recompute_runs_a_sub_layers_input_hooks_once():
    # the hooks at a selective sub-layer's entry (Megatron-SP's all-gather) run before its
    # checkpointed region: once a micro-batch, not again when backward recomputes the core
    from executor.model import Block
    block = Block(specs.load_model("tiny-gpt").layers[0])
    calls = []
    block.attn.register_forward_pre_hook(lambda _m, args: calls.append("args") or (args[0] * 2, *args[1:]))
    block.attn.register_forward_pre_hook(lambda _m, args, kwargs: calls.append("kwargs"), with_kwargs=True)
    reference = Block(specs.load_model("tiny-gpt").layers[0])
    reference.load_state_dict(block.state_dict())
    reference.attn.register_forward_pre_hook(lambda _m, args: (args[0] * 2, *args[1:]))
    checkpoint.apply_ac(block, "selective")
    x = torch.randn(2, 64, 128)
    out = block(x)
    out.sum().backward()
    assert calls == ["args", "kwargs"]
    torch.testing.assert_close(out, reference(x))  # the hooks' change to the input still applies
