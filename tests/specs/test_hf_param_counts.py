"""Parameter counts equal transformers' exactly: each family's model is built on the meta device
from the same small config as hybridpar reads (needs the optional `hf` extra)."""
from __future__ import annotations

import pytest

from specs import model_from_dict

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

_DECODER = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "llama": dict(_DECODER, attention_bias=True, mlp_bias=True, head_dim=24),
    "mistral": dict(_DECODER, sliding_window=32),
    "mixtral": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
    "qwen2": dict(_DECODER, tie_word_embeddings=True),
    "qwen2_moe": dict(_DECODER, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48,
                      shared_expert_intermediate_size=80, decoder_sparse_step=2, mlp_only_layers=[3]),
    "qwen3": dict(_DECODER, head_dim=32, use_sliding_window=True, sliding_window=16, max_window_layers=2),
    "qwen3_moe": dict(_DECODER, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=40,
                      mlp_only_layers=[0]),
    "gemma": dict(_DECODER, head_dim=32),
    "gemma2": dict(_DECODER, head_dim=32, sliding_window=16),
    "phi3": dict(_DECODER, num_key_value_heads=4),
    "deepseek_v3": dict(_DECODER, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
                        n_shared_experts=2, moe_intermediate_size=32, first_k_dense_replace=1,
                        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                        v_head_dim=12, n_group=2, topk_group=1),
    "bert": dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=160, max_position_embeddings=128),
    "gpt2": dict(vocab_size=96, n_embd=64, n_layer=3, n_head=4, n_positions=128),
    "t5": dict(vocab_size=96, d_model=64, d_kv=8, d_ff=160, num_layers=2, num_decoder_layers=3, num_heads=4,
               feed_forward_proj="gated-gelu"),
    "vit": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=160,
                image_size=32, patch_size=8, num_labels=10),
    "swin": dict(embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, image_size=64,
                 patch_size=4),
}
"""Small configs that still exercise each family's options (biases, head_dim, GQA, ties, experts,
dense layers interleaved with MoE, MLA with and without a query bottleneck)."""

MODEL_CLASS = {"bert": "AutoModelForPreTraining", "t5": "AutoModelForSeq2SeqLM", "vit": "AutoModelForImageClassification",
               "swin": "AutoModelForImageClassification"}


def transformers_count(model_type: str, config: dict) -> int:
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    auto = getattr(transformers, MODEL_CLASS.get(model_type, "AutoModelForCausalLM"))
    with torch.device("meta"):
        model = auto.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())  # parameters() counts a tied weight once


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_param_count_equals_transformers(model_type):
    config = CONFIGS[model_type]
    ours = model_from_dict({"model_type": model_type, **config}, seq_length=64).param_count()
    assert ours == transformers_count(model_type, config)


def test_deepseek_without_query_bottleneck():
    config = dict(CONFIGS["deepseek_v3"], q_lora_rank=None, attention_bias=True)
    ours = model_from_dict({"model_type": "deepseek_v3", **config}, seq_length=64).param_count()
    assert ours == transformers_count("deepseek_v3", config)
