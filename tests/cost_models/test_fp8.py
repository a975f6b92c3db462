"""FP8 layers in the analytical model, each term on a case worked out by hand (cost_models/fp8.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cost_models import fp8
from cost_models import memory as mem
from cost_models.analytical import AnalyticalModel
from cost_models.ops import gemm
from specs import LayerStrategy, SpecError, load_cluster, load_model, uniform_plan
from specs.precision import Precision

M, N, K = 1024.0, 512.0, 256.0  # tokens, weight out, weight in


@pytest.fixture(scope="module")
def h100():
    """The public-figure defaults (the cases below are worked out with them), not h100.json."""
    return AnalyticalModel(load_cluster("dgx-h100"), calibration="")


@pytest.fixture(scope="module")
def llama():
    return load_model("llama3-8b").with_seq_len(8192)


def test_fp8_gemm_runs_at_the_fp8_peak_with_its_own_efficiency(h100):
    # 8192^3: F = 2 * 8192^3 = 1.0995e12 FLOPs. BF16: (F + 1e9) / (989e12 * 0.8) = 1.3909 ms.
    # FP8: F_half scaled by 1979 / 989 = 2.0010e9; (F + 2.0010e9) / (1979e12 * 0.7) = 0.79513 ms.
    # Bytes (FP8: 2 * 8192^2 operands at 1 B + 8192^2 output at 2 B = 268 MB, 0.1 ms at
    # 3350 GB/s * 0.8) stay under the compute time.
    op = gemm("fc", 8192, 8192, 8192)
    assert h100.op_time(op) == pytest.approx(1.3909e-3, rel=1e-4)
    fp8_op = fp8.forward_ops([op], Precision.FP8_DELAYED)[-1]
    assert fp8_op.fp8 and fp8_op.nbytes == 4 * 8192 ** 2
    assert h100.op_time(fp8_op) == pytest.approx(0.79513e-3, rel=1e-4)


def test_casts_and_amax_passes_around_one_linear_gemm():
    op = gemm("fc", M, N, K)
    # delayed: input cast m k (2 + 2 x 1) = 4 m k; weight cast 4 k n; GEMM m k + k n + 2 m n
    delayed = fp8.forward_ops([op], Precision.FP8_DELAYED)
    assert [o.name for o in delayed] == ["fc_input_cast", "fc_weight_cast", "fc"]
    assert [o.nbytes for o in delayed] == [4 * M * K, 4 * K * N, M * K + K * N + 2 * M * N]
    # current scaling: an amax read (2 B per element) before each cast
    current = fp8.forward_ops([op], Precision.FP8_CURRENT)
    assert [o.name for o in current] == ["fc_input_amax", "fc_input_cast", "fc_weight_amax", "fc_weight_cast", "fc"]
    assert current[0].nbytes == 2 * M * K and current[2].nbytes == 2 * K * N
    # MXFP8: no amax pass; each FP8 element carries 1/32 B of scale: cast 2 + 2 x 33/32 = 4.0625 B
    mx = fp8.forward_ops([op], Precision.MXFP8)
    assert mx[0].nbytes == 4.0625 * M * K and mx[-1].nbytes == 33 / 32 * (M * K + K * N) + 2 * M * N
    assert fp8.forward_ops([op], Precision.BF16) == [op]


def test_backward_casts_the_output_gradient_once_for_both_gemms():
    from cost_models.ops import backward_ops
    op = gemm("fc", M, N, K)
    ops = fp8.backward_ops(backward_ops([op]), Precision.FP8_DELAYED)
    assert [o.name for o in ops] == ["fc_grad_output_cast", "fc_dgrad", "fc_wgrad"]
    # grad-output cast 4 m n; dgrad reads dY and W^T in FP8, writes dX (m k) in BF16;
    # wgrad reads dY^T and the saved X^T in FP8, writes dW (k n) in BF16
    assert [o.nbytes for o in ops] == [4 * M * N, M * N + N * K + 2 * M * K, M * N + M * K + 2 * K * N]
    assert all(o.fp8 for o in ops[1:]) and ops[1].flops == ops[2].flops == 2 * M * N * K


def test_attention_and_tp_collectives_stay_bf16(h100, llama):
    from cost_models.ops import forward_ops
    layer = llama.layers[0]
    ops = fp8.forward_ops(forward_ops(layer, 2, 1), Precision.FP8_CURRENT)
    assert {o.name for o in ops if o.fp8} == {"qkv", "proj", "fc1", "fc2"}
    assert not next(o for o in ops if o.name == "flash_attn").fp8
    s = LayerStrategy(tp=2, dp=4)
    bf16 = h100.layer_time(layer, s, 1, 4)
    fp8_time = h100.layer_time(layer, replace(s, precision="fp8-current"), 1, 4)
    assert fp8_time.tp_comm_s == bf16.tp_comm_s and fp8_time.forward_s < bf16.forward_s


def test_under_megatron_sp_a_gathered_input_is_cast_once_on_the_shard():
    # q, k, v read the all-gathered norm output: one amax and cast (named for the group) of its
    # m k / sp elements, before the gather; the row-parallel fc2 casts its own input as without SP
    ops = [gemm("q", M, N, K), gemm("k", M, N / 4, K), gemm("v", M, N / 4, K), gemm("fc2", M, K, N)]
    split = fp8.forward_ops(ops, Precision.FP8_CURRENT, sp=4)
    inputs = [o for o in split if "_input_" in o.name]
    assert [o.name for o in inputs] == ["qkv_input_amax", "qkv_input_cast", "fc2_input_amax", "fc2_input_cast"]
    assert [o.nbytes for o in inputs] == [2 * M * K / 4, 4 * M * K / 4, 2 * M * N, 4 * M * N]
    assert [o.name for o in split if o.fp8] == ["q", "k", "v", "fc2"]
    whole = fp8.forward_ops(ops, Precision.FP8_CURRENT)  # no SP: each GEMM casts its input
    assert [o.name for o in whole if o.name.endswith("_input_cast")] == [f"{n}_input_cast" for n in ("q", "k", "v", "fc2")]


def test_compile_casts_a_shared_input_once_and_eager_per_gemm(llama):
    # without SP, torch.compile merges the separate Q/K/V (and gate/up) linears' identical casts of
    # their one input; eager runs each; Megatron-TE's fused QKV and FC1 have one each already
    from cost_models import stacks
    from cost_models.ops import forward_ops
    from specs.stack import SoftwareStack
    layer = llama.layers[0]

    def input_casts(stack):
        bf16 = stacks.forward_ops(forward_ops(layer, 1, 1), layer, stack)
        ops = fp8.forward_ops(bf16, Precision.FP8_CURRENT, shared_inputs=stacks.shares_input_casts(stack))
        return [o.name for o in ops if o.name.endswith("_input_cast")]
    assert input_casts(SoftwareStack.EAGER) == [f"{n}_input_cast" for n in ("q", "k", "v", "proj", "w1", "w3", "fc2")]
    assert input_casts(SoftwareStack.COMPILE) == [f"{n}_input_cast" for n in ("qkv", "proj", "fc1", "fc2")]
    assert input_casts(SoftwareStack.MEGATRON_TE) == [f"{n}_input_cast" for n in ("qkv", "proj", "fc1", "fc2")]


def test_under_megatron_sp_fp8_gathers_its_inputs_in_fp8(h100, llama):
    # per pass and TP site, a reduce-scatter and an all-gather of n = s h bytes of BF16; an FP8
    # layer's forward (and recomputed forward) all-gathers the FP8 copy (n / 2); gradients stay BF16
    from cost_models.sequence import tp_message_bytes
    layer, groups = llama.layers[0], [(0, 1)]
    n = tp_message_bytes(layer, 1)
    rs, ag, ag8 = (h100.collective_time(kind, b, groups)
                   for kind, b in (("reduce_scatter", n), ("all_gather", n), ("all_gather", n / 2)))
    s = LayerStrategy(tp=2, dp=4, sp="megatron")
    assert h100.layer_time(layer, s, 1, 4).tp_comm_s == pytest.approx(2 * (2 * rs + 2 * ag))
    fp8_s = replace(s, precision="fp8-current")
    assert h100.layer_time(layer, fp8_s, 1, 4).tp_comm_s == pytest.approx(2 * (2 * rs + ag8 + ag))
    full = replace(fp8_s, recompute="full")
    assert h100.layer_time(layer, full, 1, 4).tp_comm_s == pytest.approx(2 * (3 * rs + 2 * ag8 + ag))


def test_fp8_keeps_linear_inputs_in_fp8_for_backward(llama):
    # llama3-8b: h = q = 4096, f = 14336. Saved per token: replicated 1 B x (QKV input h + FC1
    # input h) = 8192; split 1 B x (projection input q + FC2 input f) = 18432. At tp 2, no SP,
    # 8192 tokens: 8192 x (8192 + 18432 / 2) = 142,606,336 bytes.
    layer, s = llama.layers[0], LayerStrategy(tp=2, dp=4)
    saved = mem.activation_bytes(layer, s, 1) - mem.activation_bytes(layer, replace(s, precision="fp8-delayed"), 1)
    assert saved == 142_606_336
    full = replace(s, recompute="full")  # only the layer input is kept: nothing changes
    assert mem.activation_bytes(layer, full, 1) == mem.activation_bytes(layer, replace(full, precision="mxfp8"), 1)


def test_fp8_weight_copies_kept_or_gathered(llama):
    layer = llama.layers[0]
    params = layer.param_count() / 2  # tp 2 shard
    ddp = LayerStrategy(tp=2, dp=4)
    # DDP: both FP8 layouts kept all iteration, 2 B per local parameter on top of 16 B
    extra = (mem.layer_memory(layer, replace(ddp, precision="fp8-current"), 1, 1).parameters_bytes
             - mem.layer_memory(layer, ddp, 1, 1).parameters_bytes)
    assert extra == pytest.approx(2 * params)
    # ZeRO-3: the gathered weights are FP8 in both layouts, 2 x 33/32 B per parameter under MXFP8
    # (2 B as BF16 otherwise): a temporary, not a state
    z3 = LayerStrategy(tp=2, dp=4, dp_type="zero3")
    mx = mem.layer_memory(layer, replace(z3, precision="mxfp8"), 1, 1)
    assert mx.parameters_bytes == mem.layer_memory(layer, z3, 1, 1).parameters_bytes
    assert mx.temporary_bytes == pytest.approx(2 * 33 / 32 * params)


def test_zero3_gathers_fp8_parameters_and_reduces_bf16_gradients(h100):
    groups = [list(range(8))]
    p = 50e6
    bf16 = h100.dp_traffic(p, "zero3", groups)
    fp8_traffic = h100.dp_traffic(p, "zero3", groups, fp8.gather_bytes_per_param(Precision.FP8_CURRENT))
    # an all-gather of 1 B per parameter is the BF16 all-gather of half as many parameters
    assert fp8_traffic.micro_batch_fwd_s == pytest.approx(h100.dp_traffic(p / 2, "zero3", groups).micro_batch_fwd_s)
    # backward: that gather and the BF16 gradients' reduce-scatter at once (coll.concurrent_time_s)
    g_alpha, g_beta = h100.ring_terms("all_gather", p * 1.0, groups)
    r_alpha, r_beta = h100.ring_terms("reduce_scatter", p * mem.GRAD_BYTES_PER_PARAM, groups)
    want = max(g_alpha + g_beta, r_alpha + r_beta, min(g_alpha, r_alpha) + g_beta + r_beta)
    assert fp8_traffic.micro_batch_bwd_s == pytest.approx(want)
    assert bf16.micro_batch_bwd_s > fp8_traffic.micro_batch_bwd_s


def test_a_gpu_without_an_fp8_peak_is_refused_in_one_line(llama):
    a100 = AnalyticalModel(load_cluster("dgx-a100-80g"))
    plan = uniform_plan(llama.num_layers, dp=8, global_batch=8, precision="fp8-delayed")
    with pytest.raises(SpecError, match=r"^layer 0: fp8-delayed needs an FP8 peak, and gpu.peak_fp8_tflops"):
        a100.plan_cost(llama, plan)
    with pytest.raises(SpecError, match=r"^gpu.peak_fp8_tflops: A100-SXM4-80GB states no FP8 peak"):
        a100.layer_time(llama.layers[0], plan.layers[0], 1, 1)


def test_fp8_plans_are_faster_on_h100(h100, llama):
    plan = uniform_plan(llama.num_layers, dp=8, global_batch=16, micro_batches=2, dp_type="zero3")
    bf16, fp8_cost = h100.plan_cost(llama, plan), h100.plan_cost(llama, plan.with_precision("fp8-current"))
    assert 1.0 < bf16.iteration_time_s / fp8_cost.iteration_time_s < 2.0
