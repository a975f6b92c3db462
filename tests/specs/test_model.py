"""ModelSpec: zoo, Hugging Face configs, parameter counts against published figures."""
import json

import pytest

import specs
from specs import SpecError, from_hf_config, load_model, model_from_dict

PUBLISHED = {  # name: (parameters, relative tolerance, source)
    "gpt3-175b": (174.6e9, 0.01),      # Brown et al. 2020 / Megatron formula
    "llama2-7b": (6.74e9, 0.01),       # Touvron et al. 2023 (6,738,415,616)
    "llama2-13b": (13.0e9, 0.01),
    "llama2-70b": (69.0e9, 0.01),
    "llama3.1-405b": (405e9, 0.01),    # Llama 3 Herd of Models 2024 (405B dense)
    "bert-large": (335e6, 0.01),       # Devlin et al. 2019
    "t5-large-48": (738e6, 0.01),      # Raffel et al. 2020 (t5-large)
    "vit-huge-32": (632e6, 0.01),      # Dosovitskiy et al. 2021
    "gpt-3.6b": (3.6e9, 0.015),        # Narayanan et al. 2021, Table 1 (rounded names)
    "gpt-7.5b": (7.5e9, 0.01),
    "gpt-18.4b": (18.4e9, 0.01),
    "gpt-39.1b": (39.1e9, 0.01),
    "gpt-76.1b": (76.1e9, 0.01),
    "gpt-145.6b": (145.6e9, 0.01),
    "gpt-310.1b": (310.1e9, 0.01),
    "gpt-529.6b": (529.6e9, 0.01),
    "gpt-1t": (1008e9, 0.01),
    # the paper's "1.7B" row (h 2304, 24 layers) is 1.65B by its own formula
    "gpt-1.7b": (1.7e9, 0.03),
}


@pytest.mark.parametrize("name", specs.model_names())
def test_every_zoo_model_loads(name):
    model = load_model(name)
    assert model.num_layers > 0 and model.param_count() > 0
    assert model.forward_flops(1) > 0


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published(name):
    expected, tol = PUBLISHED[name]
    assert load_model(name).param_count() == pytest.approx(expected, rel=tol)


def test_gpt_layer_is_twelve_h_squared_plus_thirteen_h():
    layer = load_model("gpt-7.5b").layers[0]
    h = layer.hidden_size
    assert layer.param_count() == 12 * h * h + 13 * h


def test_gpt_forward_flops_follow_megatron_formula():
    layer = load_model("gpt-7.5b").layers[0]
    b, s, h = 4, layer.seq_len, layer.hidden_size
    assert layer.forward_flops(b) == 24 * b * s * h * h + 4 * b * s * s * h


def test_t5_is_encoder_then_decoder_with_cross_attention():
    model = load_model("t5-large-48")
    kinds = [l.kind for l in model.layers]
    assert kinds == ["t5_encoder"] * 24 + ["t5_decoder"] * 24
    assert model.layers[30].cross_attention_seq_len == 512
    assert model.layers[30].param_count() > model.layers[5].param_count()


def test_swin_has_four_stages_of_growing_width_and_shrinking_tokens():
    model = load_model("swin-huge-32")
    widths = sorted({(l.hidden_size, l.seq_len) for l in model.layers})
    assert widths == [(320, 3136), (640, 784), (1280, 196), (2560, 49)]
    assert [l.downsample_to for l in model.layers if l.downsample_to] == [640, 1280, 2560]
    assert len(model.layer_types()) > 4


def test_llama_70b_uses_grouped_query_attention():
    layer = load_model("llama2-70b").layers[0]
    assert (layer.num_heads, layer.kv_heads, layer.kv_width) == (64, 8, 1024)


def test_with_seq_len_and_scaled_keep_the_family():
    model = load_model("llama2-7b").with_seq_len(2048)
    assert model.seq_len == 2048 and model.head.seq_len == 2048
    small = load_model("t5-large-48").scaled(hidden_size=64, num_layers=4, seq_len=32)
    assert [l.kind for l in small.layers] == ["t5_encoder"] * 2 + ["t5_decoder"] * 2
    assert small.layers[0].hidden_size == 64 and small.seq_len == 32
    swin = load_model("swin-huge-32").scaled(hidden_size=32)
    assert swin.head.hidden_size == 256


def test_hf_config_from_file(tmp_path):
    cfg = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32,
           "vocab_size": 100}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = from_hf_config(path)
    assert model.name == tmp_path.name and model.seq_len == 32 and model.num_layers == 2
    assert specs.ModelSpec.from_hf_config(path) == model


@pytest.mark.parametrize("raw, field", [
    ({"model_type": "mamba"}, "model_type"),
    ({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_positions": 8, "vocab_size": 10}, "n_embd"),
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 5, "n_positions": 8, "vocab_size": 10},
     "num_heads"),
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": -1, "num_attention_heads": 4,
      "intermediate_size": 100, "vocab_size": 10, "max_position_embeddings": 8}, "num_hidden_layers"),
    ({"model_type": "swin", "embed_dim": 8, "depths": [2, 2], "num_heads": [1], "window_size": 7,
      "image_size": 224, "patch_size": 4}, "depths"),
])
def test_bad_configs_name_the_field(raw, field):
    with pytest.raises(SpecError) as err:
        model_from_dict(raw)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_missing_and_malformed_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match=r"bad\.json: \(json\): line 1"):
        from_hf_config(bad)
    with pytest.raises(SpecError, match="neither a zoo model"):
        load_model("no-such-model")


def test_scaled_swin_keeps_every_stage_and_its_patch_merging():
    small = load_model("swin-huge-32").scaled(hidden_size=32, num_layers=6)
    widths = [(l.hidden_size, l.downsample_to) for l in small.layers]
    assert widths == [(32, 64), (64, 128), (128, 0), (128, 0), (128, 256), (256, 0)]
    with pytest.raises(SpecError, match="fewer than the model's 4 runs"):
        load_model("swin-huge-32").scaled(num_layers=3)
