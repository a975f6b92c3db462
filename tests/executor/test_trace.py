"""--check's model-parallel collective trace (executor.trace) against the cost model's rows as the
executor runs them (cost_models.expected_collectives): tp, Megatron-SP, Ulysses, the cp ring and
a pipeline on 2 gloo ranks pass; an executor that runs other collectives (same numbers) fails
with a line naming the layer, the kind and both sides' counts."""
import json
from functools import partial

import pytest
import torch
import torch.distributed as dist

import cost_models
import specs
from executor import train
from executor.execution import CostPrediction, model_parallel_errors
from executor.parallel import sequence, tensor
from executor.run import run_plan
from specs import uniform_plan

PLANS = {
    # name: (model, plan kwargs)
    "tp2": ("tiny-llama", dict(global_batch=4, micro_batches=2, tp=2)),
    "tp2_sp": ("tiny-gpt", dict(global_batch=4, micro_batches=2, tp=2, sp="megatron")),
    "ulysses2": ("tiny-gpt", dict(global_batch=2, ulysses=2, sp="ulysses")),
    "cp2_ring": ("tiny-gpt", dict(global_batch=2, cp=2)),
    "pp2": ("tiny-gpt", dict(global_batch=4, micro_batches=2, pp=2)),
}
SLOW = {"cp2_ring", "pp2"}


def _model_plan(name):
    model_name, kwargs = PLANS[name]
    model = specs.load_model(model_name).scaled(num_layers=2)
    return model, uniform_plan(2, model=model_name, **kwargs)


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


@pytest.mark.parametrize("fault, name, line", [
    (tp_input_all_reduced_per_projection, "tp2",
     # 2 micro-batches of 2: 2 * 64 * 128 = 16384 elements; forward 2, backward 3 + 2, per micro-batch
     "layer 0 (rank 0): all_reduce ran x14 of 16384 elements over 2 ranks; the cost model charges x8 of 16384 "
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
               Row(0, "dense", "all_reduce", 999, 1))
    ran = {"layer 0": [("all_reduce", 100, 2)] * 2, "boundary 1": [("send", 50, 2)], "outside layers": [("x", 1, 2)],
           "layer 0 experts": [("all_to_all", 7, 2)]}
    assert model_parallel_errors([{"model_parallel": ran}], charged) == []
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
