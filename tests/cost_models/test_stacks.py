"""The software stacks' kernel lists (cost_models/stacks.py), worked by hand on a small block,
and the stack a cost model times, refuses and has planners state."""
import pytest

import cost_models
import planners
from cost_models import ops, stacks
from planners.base import Budget
from specs import LayerSpec, LayerStrategy, SpecError, load_cluster, load_model
from specs.stack import SoftwareStack

# h 64, 4 heads of 16, 2 kv heads: q width 64, kv width 32; SwiGLU of width 128; 8 tokens
LLAMA_LIKE = LayerSpec(kind="llama", hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
                       gated_ffn=True, seq_len=8, bias=False, norm="rmsnorm", attention="flash")
GPT_LIKE = LayerSpec(kind="gpt", hidden_size=64, num_heads=4, ffn_hidden_size=256, seq_len=8,
                     attention="flash")


def _run(layer: LayerSpec, stack: SoftwareStack) -> dict[str, ops.Op]:
    return {op.name: op for op in stacks.forward_ops(ops.forward_ops(layer, 1, 1), layer, stack)}


def test_megatron_te_is_the_fused_list():
    fused = ops.forward_ops(LLAMA_LIKE, 1, 1)
    assert stacks.forward_ops(fused, LLAMA_LIKE, SoftwareStack.MEGATRON_TE) == fused


@pytest.mark.parametrize("stack", [SoftwareStack.EAGER, SoftwareStack.COMPILE])
def test_pytorch_stacks_run_separate_projections(stack):
    run = _run(LLAMA_LIKE, stack)
    assert "qkv" not in run and "fc1" not in run
    # 2 x tokens x width x h: q 2*8*64*64, k and v 2*8*32*64; gate and up 2*8*128*64 each
    assert [run[n].flops for n in ("q", "k", "v", "w1", "w3")] == [65536, 32768, 32768, 131072, 131072]
    assert run["q"].linear == (8, 64, 64) and run["w3"].linear == (8, 128, 64)


def test_eager_rmsnorm_is_atens_composite():
    run = _run(LLAMA_LIKE, SoftwareStack.EAGER)
    norm = {n: op.nbytes for n, op in run.items() if n.startswith("norm1_")}
    # 512 elements: to fp32 6, pow 8, mean 4, scale 8, to bf16 6, weight 4 bytes each; 8 rows x 8 bytes twice
    assert norm == {"norm1_to_fp32": 3072, "norm1_pow": 4096, "norm1_mean": 2048, "norm1_scale": 4096,
                    "norm1_to_bf16": 3072, "norm1_weight": 2048, "norm1_add_eps": 64, "norm1_rsqrt": 64}
    assert "norm1" not in run and "norm2_pow" in run


def test_eager_swiglu_is_two_kernels():
    run = _run(LLAMA_LIKE, SoftwareStack.EAGER)
    # silu reads and writes 8 x 128 bf16 elements; the product reads two and writes one
    assert (run["act_silu"].nbytes, run["act_mul"].nbytes) == (4096, 6144)
    assert "act" not in _run(LLAMA_LIKE, SoftwareStack.EAGER)


def test_compile_fuses_what_eager_splits():
    run = _run(LLAMA_LIKE, SoftwareStack.COMPILE)
    fused = {op.name: op for op in ops.forward_ops(LLAMA_LIKE, 1, 1)}
    assert run["norm1"] == fused["norm1"] and run["act"] == fused["act"]


def test_layernorm_and_gelu_run_fused_in_eager():
    run = _run(GPT_LIKE, SoftwareStack.EAGER)
    fused = {op.name: op for op in ops.forward_ops(GPT_LIKE, 1, 1)}
    assert run["norm1"] == fused["norm1"] and run["fc1"] == fused["fc1"] and run["act"] == fused["act"]


def test_eager_is_slower_than_fused_on_llama():
    layer, cluster = load_model("llama3-8b").layers[0], load_cluster("dgx-h100")
    s = LayerStrategy(tp=1, dp=8)
    times = {st: cost_models.get("analytical", cluster, stack=st).layer_time(layer, s, 1, 8) for st in SoftwareStack}
    fused, eager = times[SoftwareStack.MEGATRON_TE], times[SoftwareStack.EAGER]
    assert eager.forward_s > 1.05 * fused.forward_s and eager.backward_s > 1.05 * fused.backward_s
    assert fused.forward_s <= times[SoftwareStack.COMPILE].forward_s < eager.forward_s


def test_pytorch_stacks_run_attention_through_sdpa():
    for stack in (SoftwareStack.EAGER, SoftwareStack.COMPILE):
        assert _run(LLAMA_LIKE, stack)["flash_attn"].sdpa
    assert not _run(LLAMA_LIKE, SoftwareStack.MEGATRON_TE)["flash_attn"].sdpa
    backward = {op.name: op for op in ops.backward_ops(list(_run(LLAMA_LIKE, SoftwareStack.EAGER).values()))}
    assert backward["flash_attn_bwd"].sdpa and not backward["q_dgrad"].sdpa


def test_sdpa_attention_runs_at_the_gpus_measured_kernel_rate():
    # Llama 3 8B, micro-batch 1 of 8192 tokens: the eager/compile attention kernel's FLOPs at 329.5
    # TFLOP/s on H100 (gpu.sdpa_flash_tflops); Megatron-TE's fused attention at the GEMM efficiency
    layer = load_model("llama3-8b").layers[0]
    sdpa = {op.name: op for op in stacks.forward_ops(ops.forward_ops(layer, 1, 1), layer, SoftwareStack.EAGER)}
    te = {op.name: op for op in ops.forward_ops(layer, 1, 1)}
    h100 = cost_models.get("analytical", load_cluster("dgx-h100"))
    assert h100.op_time(sdpa["flash_attn"]) == pytest.approx(sdpa["flash_attn"].flops / 329.5e12)
    assert h100.op_time(te["flash_attn"]) < 0.6 * h100.op_time(sdpa["flash_attn"])
    a100 = cost_models.get("analytical", load_cluster("dgx-a100-80g"))  # no SDPA figure: at the GEMM efficiency
    assert a100.op_time(sdpa["flash_attn"]) == a100.op_time(te["flash_attn"])


def test_planners_state_the_stack_and_models_refuse_another():
    model, cluster = load_model("tiny-gpt"), load_cluster("cpu-4")
    eager = cost_models.get("analytical", cluster, stack="eager")
    result = planners.plan("galvatron", model, cluster, Budget(memory_gib=8.0), eager)
    assert result.feasible and result.plan.stack == SoftwareStack.EAGER
    assert all(k.plan.stack == SoftwareStack.EAGER for k in result.top_k)
    assert eager.plan_cost(model, result.plan).iteration_time_s == pytest.approx(result.iteration_time_s)
    with pytest.raises(SpecError, match=r"analytical cost model cannot run the plan: stack eager \(supported: "
                                        r"megatron-te\)"):
        cost_models.get("analytical", cluster).plan_cost(model, result.plan)


def test_a_bad_stack_names_the_field():
    with pytest.raises(SpecError, match="stack: 'jax' is not a software stack"):
        cost_models.get("analytical", load_cluster("cpu-4"), stack="jax")
