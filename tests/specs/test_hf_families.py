"""Decoder families, MoE layers and the config loader's behaviour, on counts worked out by hand."""
from __future__ import annotations

import json
import logging

import pytest

from specs import LayerSpec, SpecError, from_hf_config, load_model, model_from_dict
from specs.layer_parts import MoESpec

_BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, seq_length=64)


def _moe_layer(**moe) -> LayerSpec:
    spec = MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=6, **moe)
    return LayerSpec(kind="moe", hidden_size=8, num_heads=2, ffn_hidden_size=6, gated_ffn=True,
                     seq_len=5, bias=False, norm="rmsnorm", moe=spec)


def test_moe_layer_counts_by_hand():
    layer = _moe_layer(num_shared_experts=1, shared_expert_ffn_hidden_size=10, shared_expert_gate=True)
    attention, norms = 4 * 8 * 8, 2 * 8
    router, expert, shared, gate = 4 * 8, 3 * 8 * 6, 3 * 8 * 10, 8
    assert layer.param_count() == attention + norms + router + 4 * expert + shared + gate
    assert layer.active_param_count() == attention + norms + router + 2 * expert + shared + gate
    mlp_flops_per_token = 2 * 8 * 4 + 2 * (2 * 8 * 6 * 3) + 2 * 8 * 10 * 3 + 2 * 8
    dense = LayerSpec(kind="llama", hidden_size=8, num_heads=2, ffn_hidden_size=6, gated_ffn=True,
                      seq_len=5, bias=False, norm="rmsnorm")
    dense_mlp_per_token = 2 * 8 * 6 * 3
    assert layer.forward_flops(3) == dense.forward_flops(3) + 3 * 5 * (mlp_flops_per_token - dense_mlp_per_token)


def test_capacity_factor_pads_routed_compute():
    dropless, padded = _moe_layer(), _moe_layer(capacity_factor=1.25)
    routed_per_token = 2 * (2 * 8 * 6 * 3)
    assert padded.forward_flops(1) - dropless.forward_flops(1) == pytest.approx(5 * 0.25 * routed_per_token)
    assert padded.param_count() == dropless.param_count()


def test_sliding_window_shortens_attention():
    full = LayerSpec(kind="llama", hidden_size=64, num_heads=4, ffn_hidden_size=128, seq_len=256, bias=False)
    windowed = LayerSpec(kind="llama", hidden_size=64, num_heads=4, ffn_hidden_size=128, seq_len=256,
                         bias=False, sliding_window=64)
    assert windowed.attention_span == 64 and full.attention_span == 256
    # scores and context: 2 GEMMs x 2 FLOPs x (keys skipped) x q width, for each of 256 tokens x 2 samples
    assert full.forward_flops(2) - windowed.forward_flops(2) == 2 * 2 * (256 - 64) * 64 * 256 * 2
    longer = LayerSpec(kind="llama", hidden_size=64, num_heads=4, ffn_hidden_size=128, seq_len=32,
                       bias=False, sliding_window=64)
    assert longer.attention_span == 32  # a window longer than the sequence changes nothing


def test_interleaved_dense_and_moe_layers():
    qwen = model_from_dict(dict(_BASE, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=32, decoder_sparse_step=2, mlp_only_layers=[3]))
    assert [l.kind for l in qwen.layers] == ["llama", "moe", "llama", "llama"]
    assert qwen.layers[0].ffn_hidden_size == 160 and qwen.layers[1].ffn_hidden_size == 32
    deepseek = model_from_dict(dict(_BASE, model_type="deepseek_v3", n_routed_experts=8, first_k_dense_replace=1))
    assert [l.kind for l in deepseek.layers] == ["llama", "moe", "moe", "moe"]
    assert deepseek.layers[1].moe.num_shared_experts == 1


def test_per_layer_sliding_windows():
    gemma2 = model_from_dict(dict(_BASE, model_type="gemma2", sliding_window=16))
    assert [l.sliding_window for l in gemma2.layers] == [16, 0, 16, 0]
    qwen = model_from_dict(dict(_BASE, model_type="qwen2", use_sliding_window=True, sliding_window=16,
                                max_window_layers=3))
    assert [l.sliding_window for l in qwen.layers] == [0, 0, 0, 16]
    off = model_from_dict(dict(_BASE, model_type="qwen2", sliding_window=16))
    assert all(l.sliding_window == 0 for l in off.layers)
    listed = model_from_dict(dict(_BASE, model_type="mistral", sliding_window=16,
                                  layer_types=["full_attention", "sliding_attention"] * 2))
    assert [l.sliding_window for l in listed.layers] == [0, 16, 0, 16]


def test_head_dim_and_biases_read():
    gemma = model_from_dict(dict(_BASE, model_type="gemma"))
    assert gemma.layers[0].head_size == 256 and gemma.head.tied  # transformers' Gemma defaults
    qwen2 = model_from_dict(dict(_BASE, model_type="qwen2"))
    llama = model_from_dict(dict(_BASE, model_type="llama"))
    q, kv = 64, 2 * 16
    assert qwen2.layers[0].param_count() - llama.layers[0].param_count() == q + 2 * kv  # Q/K/V biases only


def test_seq_length_warning_and_override(caplog):
    raw = dict(_BASE, model_type="llama", max_position_embeddings=512)
    del raw["seq_length"]
    with caplog.at_level(logging.WARNING, logger="specs.hf_config"):
        assert model_from_dict(raw).seq_len == 512
    assert len(caplog.records) == 1 and "max_position_embeddings = 512" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specs.hf_config"):
        assert model_from_dict(raw, seq_length=128).seq_len == 128
    assert not caplog.records


def test_directory_and_num_labels(tmp_path):
    folder = tmp_path / "my-vit"
    folder.mkdir()
    vit = dict(model_type="vit", hidden_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=32,
               patch_size=8)
    (folder / "config.json").write_text(json.dumps(vit))
    model = from_hf_config(folder)
    assert model.name == "my-vit" and model.head.output_size == 2  # transformers' default num_labels
    labelled = model_from_dict(dict(vit, id2label={str(i): f"c{i}" for i in range(7)}))
    assert labelled.head.output_size == 7


@pytest.mark.parametrize("raw, key, value", [
    (dict(_BASE, model_type="mamba"), "model_type", "mamba"),
    (dict(_BASE, model_type="mixtral", num_local_experts=4, num_experts_per_tok=5), "num_experts_per_tok", "5"),
    (dict(_BASE, model_type="deepseek_v3", first_k_dense_replace=-1), "first_k_dense_replace", "-1"),
    (dict(_BASE, model_type="mistral", sliding_window="long"), "sliding_window", "long"),
    (dict(_BASE, model_type="gemma2", layer_types=["local"] * 4), "layer_types", "local"),
    (dict(_BASE, model_type="qwen3_moe", mlp_only_layers="all"), "mlp_only_layers", "all"),
    (dict(_BASE, model_type="qwen2", head_dim=0), "head_dim", "0"),
])
def test_refused_configs_name_key_and_value(raw, key, value):
    with pytest.raises(SpecError) as err:
        model_from_dict(raw)
    assert err.value.field == key and value in str(err.value) and "\n" not in str(err.value)


def test_zoo_moe_models_match_published_sizes():
    """Published totals: Mixtral 8x7B 46.7B (12.9B active), DeepSeek-V3 671B (37B active)."""
    mixtral, deepseek = load_model("mixtral-8x7b"), load_model("deepseek-v3")
    assert round(mixtral.param_count() / 1e9, 1) == 46.7 and round(mixtral.active_param_count() / 1e9, 1) == 12.9
    assert round(deepseek.param_count() / 1e9) == 671 and int(deepseek.active_param_count() / 1e9) == 37
