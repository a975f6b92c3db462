"""Build a ModelSpec from a Hugging Face style config.json (BERT, T5, ViT, Swin, GPT-2, and the
decoder families of specs.hf_decoders: LLaMA, Mistral, Mixtral, Qwen, Gemma, Phi-3, DeepSeek-V3).

Offline: only the file is read. Keys beyond Hugging Face's own (documented in the README):
``seq_length`` (training sequence length), ``decoder_seq_length`` (T5 target length),
``name`` (the zoo name).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from specs.errors import SpecError, load_json_with, positive_int
from specs.limits import within_limit
from specs.hf_decoders import DECODER_BUILDERS
from specs.hf_extras import config_attention, config_name, warn_unmodelled
from specs.schema import ModelConfigFile, check
from specs.model import EmbeddingSpec, HeadSpec, LayerSpec, ModelSpec

log = logging.getLogger(__name__)


class _Config:
    """Typed access to a config dict; a missing or bad key raises SpecError naming it."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def int(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            if key in self.raw and self.raw[key] is not None:
                return within_limit(positive_int(self.raw[key], key), key)
        if default is None:
            raise SpecError(keys[0], "missing (required for this model_type)")
        return default

    def count(self, key: str, default: int) -> int:
        """An integer >= 0 (null = ``default``)."""
        value = self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(key, f"must be an integer >= 0, got {value!r}")
        return within_limit(value, key)

    def seq_len(self, *keys: str) -> int:
        """The training sequence length: seq_length, else the first of ``keys`` (default
        max_position_embeddings) with a one-line warning saying so."""
        if self.raw.get("seq_length") is not None:
            return self.int("seq_length")
        keys = keys or ("max_position_embeddings",)
        key = next((k for k in keys if self.raw.get(k) is not None), keys[0])
        seq = self.int(key)
        log.warning("%s: no seq_length given; training sequence length taken from %s = %d",
                    self.raw.get("name", "config"), key, seq)
        return seq

    def num_labels(self) -> int:
        """Classes as transformers counts them: num_labels, else len(id2label), else 2."""
        labels = self.raw.get("id2label")
        if self.raw.get("num_labels") is None and isinstance(labels, dict) and labels:
            return len(labels)
        return self.int("num_labels", default=2)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(key, f"must be true or false, got {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise SpecError(key, f"must be a number > 0, got {value!r}")
        return float(value)

    def get(self, key: str, default: Any) -> Any:
        value = self.raw.get(key, default)
        return default if value is None else value


def _bert(c: _Config, name: str) -> ModelSpec:
    h, seq = c.int("hidden_size"), c.seq_len()
    layer = LayerSpec(kind="bert", hidden_size=h, num_heads=c.int("num_attention_heads"),
                      ffn_hidden_size=c.int("intermediate_size", default=4 * h), seq_len=seq)
    emb = EmbeddingSpec(hidden_size=h, vocab_size=c.int("vocab_size"),
                        max_positions=c.int("max_position_embeddings", default=seq),
                        type_vocab_size=c.int("type_vocab_size", default=2), norm="layernorm")
    head = HeadSpec(kind="lm", hidden_size=h, output_size=c.int("vocab_size"), tied=True,
                    pooler=True, transform=True, next_sentence=True, seq_len=seq)
    return ModelSpec(name=name, family="bert", embedding=emb, head=head,
                     layers=(layer,) * c.int("num_hidden_layers"))


def _gpt2(c: _Config, name: str) -> ModelSpec:
    h = c.int("n_embd", "hidden_size")
    seq = c.seq_len("n_positions", "n_ctx")
    layer = LayerSpec(kind="gpt", hidden_size=h, num_heads=c.int("n_head", "num_attention_heads"),
                      ffn_hidden_size=c.int("n_inner", default=4 * h), seq_len=seq)
    emb = EmbeddingSpec(hidden_size=h, vocab_size=c.int("vocab_size"),
                        max_positions=c.int("n_positions", default=seq))
    head = HeadSpec(kind="lm", hidden_size=h, output_size=c.int("vocab_size"),
                    tied=c.flag("tie_word_embeddings", True), final_norm="layernorm", seq_len=seq)
    return ModelSpec(name=name, family="gpt2", embedding=emb, head=head,
                     layers=(layer,) * c.int("n_layer", "num_hidden_layers"))


def _t5(c: _Config, name: str) -> ModelSpec:
    h, heads = c.int("d_model"), c.int("num_heads")
    src = c.int("seq_length", default=512)
    tgt = c.int("decoder_seq_length", default=src)
    gated = str(c.get("feed_forward_proj", "relu")).startswith("gated")
    common = dict(hidden_size=h, num_heads=heads, head_dim=c.int("d_kv", default=h // heads),
                  ffn_hidden_size=c.int("d_ff"), gated_ffn=gated, bias=False, norm="rmsnorm")
    rel = c.int("relative_attention_num_buckets", default=32) * heads
    n_enc = c.int("num_layers")
    n_dec = c.int("num_decoder_layers", default=n_enc)
    enc = [LayerSpec(kind="t5_encoder", seq_len=src, relative_position_params=rel if i == 0 else 0,
                     stack_norm=i == n_enc - 1, **common) for i in range(n_enc)]
    dec = [LayerSpec(kind="t5_decoder", seq_len=tgt, cross_attention_seq_len=src,
                     relative_position_params=rel if i == 0 else 0, **common) for i in range(n_dec)]
    emb = EmbeddingSpec(hidden_size=h, vocab_size=c.int("vocab_size"))
    # final norms of the stacks: the encoder's on its last layer, the decoder's in the head
    head = HeadSpec(kind="lm", hidden_size=h, output_size=c.int("vocab_size"),
                    tied=c.flag("tie_word_embeddings", True), final_norm="rmsnorm", seq_len=tgt)
    model = ModelSpec(name=name, family="t5", embedding=emb, head=head, layers=tuple(enc + dec))
    return model


def _vit(c: _Config, name: str) -> ModelSpec:
    h, patch = c.int("hidden_size"), c.int("patch_size")
    tokens = (c.int("image_size") // patch) ** 2 + 1
    layer = LayerSpec(kind="vit", hidden_size=h, num_heads=c.int("num_attention_heads"),
                      ffn_hidden_size=c.int("intermediate_size", default=4 * h), seq_len=tokens)
    emb = EmbeddingSpec(kind="patch", hidden_size=h, patch_size=patch, cls_token=True,
                        in_channels=c.int("num_channels", default=3), max_positions=tokens)
    head = HeadSpec(kind="classifier", hidden_size=h, output_size=c.num_labels(),
                    final_norm="layernorm")
    return ModelSpec(name=name, family="vit", embedding=emb, head=head,
                     layers=(layer,) * c.int("num_hidden_layers"))


def _swin(c: _Config, name: str) -> ModelSpec:
    depths, heads = c.get("depths", None), c.get("num_heads", None)
    if not isinstance(depths, list) or not isinstance(heads, list) or len(depths) != len(heads):
        raise SpecError("depths", f"depths {depths!r} and num_heads {heads!r} must be lists of equal length")
    dim, patch, window = c.int("embed_dim"), c.int("patch_size"), c.int("window_size")
    side = c.int("image_size") // patch
    ratio = c.number("mlp_ratio", 4.0)
    layers: list[LayerSpec] = []
    for stage, (depth, nh) in enumerate(zip(depths, heads)):
        width = dim * 2**stage
        for i in range(positive_int(depth, f"depths[{stage}]")):
            last_of_stage = i == depth - 1 and stage < len(depths) - 1
            layers.append(LayerSpec(
                kind="swin", hidden_size=width, num_heads=positive_int(nh, f"num_heads[{stage}]"),
                ffn_hidden_size=int(width * ratio), seq_len=side * side,
                attention_window=min(window, side) ** 2,
                relative_position_params=(2 * window - 1) ** 2 * nh,
                downsample_to=2 * width if last_of_stage else 0))
        side //= 2 if stage < len(depths) - 1 else 1
    emb = EmbeddingSpec(kind="patch", hidden_size=dim, patch_size=patch,
                        in_channels=c.int("num_channels", default=3), norm="layernorm")
    head = HeadSpec(kind="classifier", hidden_size=layers[-1].hidden_size,
                    output_size=c.num_labels(), final_norm="layernorm")
    return ModelSpec(name=name, family="swin", embedding=emb, head=head, layers=tuple(layers))


BUILDERS: dict[str, Callable[[_Config, str], ModelSpec]] = {
    "bert": _bert, "gpt2": _gpt2, "t5": _t5, "vit": _vit, "swin": _swin, **DECODER_BUILDERS,
}


def model_from_dict(raw: dict[str, Any], name: str = "model", seq_length: int | None = None) -> ModelSpec:
    """A ModelSpec from an already-parsed config dict; ``seq_length`` overrides the file's."""
    if not isinstance(raw, dict):
        raise SpecError("(top level)", f"expected a JSON object, got {type(raw).__name__}")
    check(ModelConfigFile, raw)
    kind = raw.get("model_type")
    if not isinstance(kind, str) or kind not in BUILDERS:
        raise SpecError("model_type", f"must be one of {', '.join(BUILDERS)}; got {kind!r}")
    if seq_length is not None:
        raw = {**raw, "seq_length": positive_int(seq_length, "seq_length")}
    name = str(raw.get("name", name))
    raw = {**raw, "name": name}  # the warnings name the model
    warn_unmodelled(raw, name)
    return BUILDERS[kind](_Config(raw), name).with_attention(config_attention(raw, kind))


def from_hf_config(path: str | Path, seq_length: int | None = None) -> ModelSpec:
    """Read a config.json, or the config.json in a directory (as ``save_pretrained`` writes);
    any error is one SpecError line naming the file and the field."""
    path = Path(path)
    if path.is_dir():  # named after the directory, as a Hugging Face repository is
        path = path / "config.json"
    return load_json_with(path, lambda raw: model_from_dict(raw, name=config_name(path, raw)
                                                            if isinstance(raw, dict) else "model",
                                                            seq_length=seq_length))
