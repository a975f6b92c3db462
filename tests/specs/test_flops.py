"""Model FLOPs, tokens/s/GPU, TFLOP/s/GPU and MFU against hand-worked published formulas."""
import json
import logging

import pytest

from specs import from_hf_config, load_cluster, load_model, model_from_dict
from specs.flops import throughput, training_flops


def test_gpt3_175b_matches_megatron_formula():
    # Narayanan et al. 2021: 72 B s L h^2 (1 + s / 6h + V / 12 L h) per iteration
    model = load_model("gpt3-175b")
    B, s, L, h, V = 8, 2048, 96, 12288, 50257
    expected = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert training_flops(model, B) == pytest.approx(expected, rel=1e-12)
    # 72 L h^2 = 1.0437e12 per token, times 1 + 1/36 + 0.00355
    assert expected / (B * s) == pytest.approx(1.0764e12, rel=1e-4)


def test_llama3_8b_is_six_n_plus_attention():
    # GQA: 6 x matmul weights (q, o: h^2; k, v: h x 1024; gated MLP 3 h x 14336; head h x V)
    # per token, plus 12 L s (heads x head width) for QK^T and attention over V
    model = load_model("llama3-8b")
    h, L, s, V = 4096, 32, 8192, 128256
    weights = L * (2 * h * h + 2 * h * 1024 + 3 * h * 14336) + h * V
    per_token = 6 * weights + 12 * L * s * h
    assert per_token == 57_912_852_480
    assert training_flops(model, 2) == 2 * s * per_token


def test_mfu_tokens_and_tflops_per_gpu():
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-h100")  # 8 GPUs, 989 TFLOP/s
    flops = training_flops(model, 8)
    t = flops / (8 * 0.5 * 989e12)  # every GPU at half its peak
    fig = throughput(model, cluster, 8, t)
    assert fig.mfu == pytest.approx(0.5)
    assert fig.tflops_per_gpu == pytest.approx(494.5)
    assert fig.tokens_per_s_per_gpu == pytest.approx(8 * 2048 / t / 8)


LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 128, "vocab_size": 100, "seq_length": 32}


def test_attention_follows_the_config_and_the_family():
    assert {l.attention for l in model_from_dict(LLAMA).layers} == {"flash"}
    assert {l.attention for l in model_from_dict({**LLAMA, "attn_implementation": "eager"}).layers} == {"eager"}
    assert {l.attention for l in load_model("gpt3-175b").layers} == {"eager"}  # gpt2 as published


def test_unknown_dtype_and_unread_keys_warn_in_one_line(caplog):
    with caplog.at_level(logging.WARNING):
        model_from_dict({**LLAMA, "torch_dtype": "float8_e4m3fn", "quantization_config": {"bits": 8}}, name="m")
    lines = [r.getMessage() for r in caplog.records]
    assert any("torch_dtype float8_e4m3fn is not modelled" in l for l in lines)
    assert any("quantization_config" in l for l in lines)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model_from_dict({**LLAMA, "torch_dtype": "bfloat16"}, name="m")
    assert not caplog.records


def test_config_json_named_after_name_or_path_or_folder(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    assert from_hf_config(folder / "config.json").name == "my-llama"
    (folder / "config.json").write_text(json.dumps({**LLAMA, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}))
    assert from_hf_config(folder).name == "Meta-Llama-3-8B"
