"""Decoder-only LLM families of Hugging Face configs (LLaMA, Mistral, Mixtral, Qwen2/3 and their
MoE variants, Gemma, Gemma-2, Phi-3, DeepSeek-V3): one table of what differs between them.

Defaults for absent keys follow each family's transformers config class.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specs.errors import SpecError, require
from specs.layer_parts import MLASpec, MoESpec
from specs.model import EmbeddingSpec, HeadSpec, LayerSpec, ModelSpec

Config = Any
"""specs.hf_config._Config (typed key access); not imported to keep the modules acyclic."""


def _no_window(c: Config, i: int) -> bool:
    return False


def _window_everywhere(c: Config, i: int) -> bool:
    return True


def _window_from_layer(c: Config, i: int) -> bool:
    """Qwen2/Qwen3: layers from max_window_layers on use the window."""
    return i >= c.int("max_window_layers", default=28)


def _window_qwen2_moe(c: Config, i: int) -> bool:
    return i % 2 == 0 and i < c.int("max_window_layers", default=28)


def _window_even_layers(c: Config, i: int) -> bool:
    """Gemma-2: local (sliding) and global attention alternate, starting local."""
    return i % 2 == 0


def _dense_layer(c: Config, i: int) -> bool:
    return True


def _expert_layer(c: Config, i: int) -> bool:
    return False


def _qwen_dense(c: Config, i: int) -> bool:
    """Qwen MoE: a layer is dense if listed in mlp_only_layers or off the decoder_sparse_step."""
    only = c.get("mlp_only_layers", [])
    layers = c.int("num_hidden_layers")
    if not isinstance(only, list):
        raise SpecError("mlp_only_layers", f"must be a list of layer indices, got {only!r}")
    for j, index in enumerate(only):
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < layers:
            raise SpecError(f"mlp_only_layers[{j}]", f"must be a layer index in [0, {layers}) "
                            f"(num_hidden_layers {layers}), got {index!r}")
    return i in only or (i + 1) % c.int("decoder_sparse_step", default=1) != 0


def _deepseek_dense(c: Config, i: int) -> bool:
    return i < c.count("first_k_dense_replace", 0)


def _top_k(c: Config, experts_key: str, experts: int, default: int) -> int:
    k = c.int("num_experts_per_tok", default=default)
    require(k <= experts, "num_experts_per_tok", f"{k} > {experts_key}({experts})")
    return k


def _mixtral_moe(c: Config) -> MoESpec:
    e = c.int("num_local_experts", default=8)
    return MoESpec(num_experts=e, top_k=_top_k(c, "num_local_experts", e, 2),
                   expert_ffn_hidden_size=c.int("intermediate_size"))


def _qwen2_moe(c: Config) -> MoESpec:
    e = c.int("num_experts", default=60)
    shared = c.int("shared_expert_intermediate_size", default=5632)
    return MoESpec(num_experts=e, top_k=_top_k(c, "num_experts", e, 4),
                   expert_ffn_hidden_size=c.int("moe_intermediate_size", default=1408),
                   num_shared_experts=1, shared_expert_ffn_hidden_size=shared, shared_expert_gate=True)


def _qwen3_moe(c: Config) -> MoESpec:
    e = c.int("num_experts", default=128)
    return MoESpec(num_experts=e, top_k=_top_k(c, "num_experts", e, 8),
                   expert_ffn_hidden_size=c.int("moe_intermediate_size", default=768))


def _deepseek_moe(c: Config) -> MoESpec:
    e = c.int("n_routed_experts", default=256)
    shared = c.count("n_shared_experts", 1)
    groups, per_token = _deepseek_groups(c)
    return MoESpec(num_experts=e, top_k=_top_k(c, "n_routed_experts", e, 8),
                   expert_ffn_hidden_size=c.int("moe_intermediate_size", default=2048),
                   num_shared_experts=shared, expert_groups=groups, groups_per_token=per_token)


def _deepseek_groups(c: Config) -> tuple[int, int | None]:
    """(n_group, topk_group) of DeepSeek's group-limited routing; (1, None) where the config has no
    groups or its ``topk_method`` is ``greedy`` (DeepSeek-V2-Lite: n_group 1, groups unused)."""
    groups = c.count("n_group", 1) or 1
    if groups == 1 or c.raw.get("topk_method") == "greedy":
        return 1, None
    per_token = c.count("topk_group", groups) or groups
    return groups, per_token if per_token < groups else None


def _deepseek_mla(c: Config) -> MLASpec:
    q_rank = c.count("q_lora_rank", 0) if "q_lora_rank" in c.raw else 1536  # null = no bottleneck
    return MLASpec(q_lora_rank=q_rank, kv_lora_rank=c.int("kv_lora_rank", default=512),
                   qk_nope_head_dim=c.int("qk_nope_head_dim", default=128),
                   qk_rope_head_dim=c.int("qk_rope_head_dim", default=64),
                   v_head_dim=c.int("v_head_dim", default=128))


@dataclass(frozen=True)
class Family:
    """How one decoder family's config maps onto LayerSpec fields."""

    head_dim: int = 0
    """head_dim when the key is absent; 0 = hidden_size // num_attention_heads."""
    tied: bool = False
    """tie_word_embeddings when absent."""
    qkv_bias: tuple[str, bool] = ("", False)
    """(config key, default) for Q/K/V biases; key '' = the default always holds."""
    out_bias_key: str = ""
    """Config key that also gives the output projection a bias ('' = never)."""
    mlp_bias_key: str = ""
    """Config key that gives the MLP biases ('' = never)."""
    qk_norm: bool = False
    """LayerSpec.qk_norm (Qwen3)."""
    sandwich_norm: bool = False
    """LayerSpec.sandwich_norm (Gemma-2)."""
    window_default: int = 0
    """sliding_window when absent (0 = none)."""
    window_switch: str = ""
    """Config key that must be true for any window to apply (Qwen: use_sliding_window)."""
    windowed: Callable[[Config, int], bool] = _no_window
    """Whether layer i uses the sliding window when layer_types does not say."""
    dense: Callable[[Config, int], bool] = _dense_layer
    """Whether layer i has a dense MLP (else experts, from ``moe``)."""
    moe: Callable[[Config], MoESpec] | None = None
    """Reads the experts of a MoE layer; None = a dense family."""
    mla: Callable[[Config], MLASpec] | None = None
    """Reads multi-head latent attention; None = q/k/v projections."""


_QWEN = dict(windowed=_window_from_layer, window_default=4096, window_switch="use_sliding_window")
FAMILIES: dict[str, Family] = {
    "llama": Family(qkv_bias=("attention_bias", False), out_bias_key="attention_bias", mlp_bias_key="mlp_bias"),
    "mistral": Family(windowed=_window_everywhere, window_default=4096),
    "mixtral": Family(windowed=_window_everywhere, dense=_expert_layer, moe=_mixtral_moe),
    "qwen2": Family(qkv_bias=("", True), **_QWEN),
    "qwen2_moe": Family(qkv_bias=("qkv_bias", True), windowed=_window_qwen2_moe, window_default=4096,
                        window_switch="use_sliding_window", dense=_qwen_dense, moe=_qwen2_moe),
    "qwen3": Family(head_dim=128, qkv_bias=("attention_bias", False), out_bias_key="attention_bias",
                    qk_norm=True, **_QWEN),
    "qwen3_moe": Family(qkv_bias=("attention_bias", False), out_bias_key="attention_bias", qk_norm=True,
                        windowed=_window_everywhere, window_default=4096, window_switch="use_sliding_window",
                        dense=_qwen_dense, moe=_qwen3_moe),
    "gemma": Family(head_dim=256, tied=True, qkv_bias=("attention_bias", False), out_bias_key="attention_bias"),
    "gemma2": Family(head_dim=256, tied=True, qkv_bias=("attention_bias", False), out_bias_key="attention_bias",
                     sandwich_norm=True, windowed=_window_even_layers, window_default=4096),
    "phi3": Family(windowed=_window_everywhere),
    "deepseek_v3": Family(qkv_bias=("attention_bias", False), out_bias_key="attention_bias",
                          dense=_deepseek_dense, moe=_deepseek_moe, mla=_deepseek_mla),
}
"""Every decoder family from_hf_config reads, by model_type."""

LAYER_TYPES = ("full_attention", "sliding_attention")


def _sliding_window(c: Config, fam: Family, i: int, n_layers: int) -> int:
    """The window of layer i (0 = full attention): config layer_types first, else the family rule."""
    window = c.raw.get("sliding_window", fam.window_default)
    if window is None or window == 0 or (fam.window_switch and not c.flag(fam.window_switch, False)):
        return 0
    window = c.int("sliding_window", default=fam.window_default)
    types = c.raw.get("layer_types")
    if types is None:
        return window if fam.windowed(c, i) else 0
    if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
        raise SpecError("layer_types", f"must list {n_layers} of {', '.join(LAYER_TYPES)}; got {types!r}")
    return window if types[i] == "sliding_attention" else 0


def _layer(c: Config, fam: Family, i: int, n_layers: int, seq: int) -> LayerSpec:
    h, heads = c.int("hidden_size"), c.int("num_attention_heads")
    qkv_key, qkv_default = fam.qkv_bias
    mla = fam.mla(c) if fam.mla else None
    dense = fam.dense(c, i) or fam.moe is None
    moe = None if dense else fam.moe(c)
    return LayerSpec(
        kind="llama" if dense else "moe", hidden_size=h, num_heads=heads,
        num_kv_heads=heads if mla else c.int("num_key_value_heads", default=heads),
        head_dim=mla.qk_head_dim if mla else c.int("head_dim", default=fam.head_dim or h // heads),
        ffn_hidden_size=c.int("intermediate_size") if dense else moe.expert_ffn_hidden_size,
        gated_ffn=True, seq_len=seq, bias=False, norm="rmsnorm",
        qkv_bias=c.flag(qkv_key, qkv_default) if qkv_key else qkv_default,
        out_bias=c.flag(fam.out_bias_key, False) if fam.out_bias_key else False,
        mlp_bias=c.flag(fam.mlp_bias_key, False) if fam.mlp_bias_key else False,
        qk_norm=fam.qk_norm, sandwich_norm=fam.sandwich_norm,
        sliding_window=_sliding_window(c, fam, i, n_layers), moe=moe, mla=mla)


def decoder(c: Config, name: str, family: str) -> ModelSpec:
    """A decoder-only model of one of FAMILIES."""
    fam = FAMILIES[family]
    seq, vocab, h = c.seq_len(), c.int("vocab_size"), c.int("hidden_size")
    n = c.int("num_hidden_layers")
    layers = tuple(_layer(c, fam, i, n, seq) for i in range(n))
    head = HeadSpec(kind="lm", hidden_size=h, output_size=vocab,
                    tied=c.flag("tie_word_embeddings", fam.tied), final_norm="rmsnorm", seq_len=seq)
    return ModelSpec(name=name, family=family, embedding=EmbeddingSpec(hidden_size=h, vocab_size=vocab),
                     layers=layers, head=head)


DECODER_BUILDERS: dict[str, Callable[[Config, str], ModelSpec]] = {
    family: (lambda c, name, family=family: decoder(c, name, family)) for family in FAMILIES
}
