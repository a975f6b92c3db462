"""The analytical cost model on MoE, MLA and sliding-window layers: kernel FLOPs against the
spec's own counts, a sliding window's score GEMM and a MoE layer's activations by hand."""
from __future__ import annotations

import pytest

from cost_models.memory import activation_bytes
from cost_models.ops import forward_ops
from specs import LayerSpec, LayerStrategy, model_from_dict
from specs.layer_parts import MoESpec

_BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, seq_length=32)
FAMILIES = {
    "mistral": dict(sliding_window=16),
    "mixtral": dict(num_local_experts=4),
    "qwen2_moe": dict(num_experts=6, moe_intermediate_size=48, decoder_sparse_step=2),
    "qwen3": dict(head_dim=32),
    "gemma2": dict(head_dim=32, sliding_window=16),
    "deepseek_v3": dict(n_routed_experts=8, n_shared_experts=2, moe_intermediate_size=32, first_k_dense_replace=1,
                        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kernel_flops_equal_layer_flops(family):
    """forward_ops (kernel by kernel) and LayerSpec.forward_flops (per-token formula) are written
    separately; they must agree on every layer kind, MoE (active experts) and MLA included."""
    model = model_from_dict(dict(_BASE, model_type=family, **FAMILIES[family]))
    for layer in model.layer_types():
        assert sum(op.flops for op in forward_ops(layer, 1, 3)) == pytest.approx(layer.forward_flops(3))


def test_sliding_window_score_gemm_by_hand():
    layer = LayerSpec(kind="llama", hidden_size=64, num_heads=4, ffn_hidden_size=128, seq_len=256,
                      bias=False, sliding_window=64)
    ops = {op.name: op for op in forward_ops(layer, 2, 3)}
    # 3 samples x 2 heads per rank, each (256 x 16) @ (16 x 64): queries against the 64 keys in the window
    assert ops["scores"].flops == 2 * 3 * 2 * 256 * 64 * 16
    assert ops["context"].flops == 2 * 3 * 2 * 256 * 16 * 64


def test_moe_activations_by_hand():
    h, e, f, tokens = 8, 4, 6, 2 * 5
    moe = LayerSpec(kind="moe", hidden_size=h, num_heads=2, ffn_hidden_size=f, gated_ffn=True, seq_len=5,
                    bias=False, norm="rmsnorm", moe=MoESpec(num_experts=e, top_k=2, expert_ffn_hidden_size=f))
    dense = LayerSpec(kind="llama", hidden_size=h, num_heads=2, ffn_hidden_size=f, gated_ffn=True, seq_len=5,
                      bias=False, norm="rmsnorm")
    strategy = LayerStrategy(tp=1, dp=1)
    # per token: router logits 2e, two dispatched copies 2 x 2h, and a second expert pass's 3 x 2f
    extra = 2 * e + 2 * 2 * h + 3 * 2 * f
    assert activation_bytes(moe, strategy, 2) - activation_bytes(dense, strategy, 2) == tokens * extra
