"""torchtitan's per-op selective checkpointing (Recompute.SELECTIVE_OP) in the cost models, worked
out by hand on a Llama 3 8B block (cost_models/op_selective.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cost_models import fp8, op_selective, stacks
from cost_models import memory as mem
from cost_models import sequence as seq
from cost_models.analytical import AnalyticalModel
from cost_models.ops import forward_ops
from specs import LayerStrategy, Recompute, SpecError, load_cluster, load_model, uniform_plan
from specs.precision import Precision
from specs.stack import SoftwareStack

KEPT = {"q", "v", "w1", "fc2", "flash_attn"}
"""wq, wv, w1 and w2 (the 1st, 3rd, 5th and 7th mm of the block) and the SDPA kernel."""


@pytest.fixture(scope="module")
def layer():
    return load_model("llama3-8b").with_seq_len(8192).layers[0]


def eager_ops(layer, tp: int = 1):
    return stacks.forward_ops(forward_ops(layer, tp, 1), layer, SoftwareStack.EAGER)


def op_sac(**kwargs) -> LayerStrategy:
    return LayerStrategy(recompute=Recompute.SELECTIVE_OP, **kwargs)


def test_every_other_matmul_is_kept_in_bf16_and_fp8(layer):
    ops = eager_ops(layer)
    assert [op.name for op in op_selective.saved_gemms(ops)] == ["q", "v", "w1", "fc2"]
    recomputed = [op.name for op in op_selective.recomputed_ops(ops)]
    assert not KEPT & set(recomputed) and {"k", "proj", "w3", "act_silu", "act_mul", "residual"} <= set(recomputed)
    # torchao's float8 linear dispatches aten.mm on its FP8 tensors: the same GEMMs are kept and
    # every cast runs again
    fp8_ops = fp8.forward_ops(ops, Precision.FP8_CURRENT)
    assert [op.name for op in op_selective.saved_gemms(fp8_ops)] == ["q", "v", "w1", "fc2"]
    casts = [op.name for op in fp8_ops if op.name.endswith(("_cast", "_amax"))]
    assert len(casts) == 28 and set(casts) <= {op.name for op in op_selective.recomputed_ops(fp8_ops)}


def test_kept_bytes_per_token_by_hand(layer):
    # h 4096, q 4096, kv 1024, f 14336, 32 heads; per token: the input h, the outputs of wq (q),
    # wv (kv), w1 (f) and w2 (h), the attention output (q): 31744 BF16 elements, 63488 B, and the
    # log-sum-exp (4 B x 32 heads): 63616 B; Megatron's selective keeps about twice that
    tokens = 8192
    assert mem.activation_bytes(layer, op_sac(), 1) == tokens * 63616
    assert mem.activation_bytes(layer, LayerStrategy(recompute=Recompute.SELECTIVE), 1) > 1.9 * tokens * 63616
    # tp 2 with Megatron-SP: the input h / 2, wq q / 2, wv kv / 2, w1 f / 2, w2's partial sums h
    # (every token: its reduce-scatter comes after it), the attention output q / 2 and the two
    # reduce-scatters' results 2 h / 2: 22016 elements, 44032 B, and 16 heads' log-sum-exp: 44096 B
    assert mem.activation_bytes(layer, op_sac(tp=2, sp="megatron"), 1) == tokens * 44096
    # an FP8 layer keeps the same BF16 matmul outputs (no FP8 copies of the inputs)
    fp8_layer = op_sac(precision=Precision.FP8_CURRENT)
    assert mem.activation_bytes(layer, fp8_layer, 1) == tokens * 63616


def test_backward_rebuilds_what_the_layer_did_not_keep(layer):
    s = op_sac()
    kept, everything = mem.activation_bytes(layer, s, 1), mem.activation_bytes(layer, LayerStrategy(), 1)
    extra = mem.layer_memory(layer, s, 1, 1).temporary_bytes - mem.layer_memory(layer, LayerStrategy(), 1, 1).temporary_bytes
    assert extra == pytest.approx(everything - kept)


def test_recompute_runs_the_kernels_not_kept(layer):
    eager = AnalyticalModel(load_cluster("dgx-h100"), calibration="", stack="eager")
    again = [op for op in eager_ops(layer) if op.name not in KEPT]
    assert eager.recompute_time(layer, op_sac(), 1) == pytest.approx(eager.ops_time(again))
    selective = eager.recompute_time(layer, LayerStrategy(recompute=Recompute.SELECTIVE), 1)
    full = eager.recompute_time(layer, LayerStrategy(recompute=Recompute.FULL), 1)
    assert selective < eager.recompute_time(layer, op_sac(), 1) < full


def test_megatron_sp_reruns_the_gathers_and_keeps_the_reduce_scatters(layer):
    # per call: a reduce-scatter 1 s, an all-gather 10 s; two of each per pass
    calls = {"reduce_scatter": 1.0, "all_gather": 10.0}
    price = lambda kind, nbytes, groups: calls[kind]  # noqa: E731

    def traffic(recompute):
        s = LayerStrategy(tp=2, sp="megatron", recompute=recompute)
        return seq.tp_comm_time(price, layer, s, 1, [[0, 1]], 2)
    # forward rs + ag, backward rs + ag; full adds a forward's rs + ag, selective-op its ag only
    assert traffic(Recompute.SELECTIVE) == 2 * (2 * 1 + 2 * 10)
    assert traffic(Recompute.SELECTIVE_OP) == 2 * (2 * 1 + 3 * 10)
    assert traffic(Recompute.FULL) == 2 * (3 * 1 + 3 * 10)


def test_only_a_pytorch_stack_runs_the_policy():
    model = load_model("llama3-8b").with_seq_len(2048)
    plan = uniform_plan(len(model.layers), dp=8, dp_type="zero3", recompute="selective-op", global_batch=8)
    with pytest.raises(SpecError, match=r"layers\[0\]\.recompute: selective-op .* stack megatron-te"):
        replace(plan, stack="megatron-te")
    cluster = load_cluster("dgx-h100")
    with pytest.raises(SpecError, match="selective-op"):
        AnalyticalModel(cluster, calibration="").plan_cost(model, plan)
    cost = AnalyticalModel(cluster, calibration="", stack="compile").plan_cost(model, replace(plan, stack="compile"))
    assert cost.iteration_time_s > 0
