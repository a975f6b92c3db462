"""What a Hugging Face config says beyond the shapes: how attention is computed, the dtype, and
keys that would change the training cost but are not modelled (each a one-line warning)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from specs.errors import SpecError

log = logging.getLogger("specs.hf_config")

FLASH_FAMILIES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
                            "gemma2", "phi3", "deepseek_v3"})
"""Families whose transformers classes support fused attention (SDPA / FlashAttention-2), which
transformers picks when the config names none: these train with flash-style attention."""
ATTN_IMPLEMENTATIONS = {"eager": "eager", "sdpa": "flash", "flash_attention_2": "flash",
                        "flash_attention_3": "flash", "flex_attention": "flash"}
"""transformers' attn_implementation values -> ModelSpec attention kinds (SDPA and flex keep
no s x s probabilities for backward, like FlashAttention)."""
TRAINED_DTYPES = frozenset({"bfloat16", "float16", "float32"})
"""Checkpoint dtypes trained in BF16 mixed precision, the only precision modelled today."""
UNREAD_KEYS = {"quantization_config": "quantised weights", "num_nextn_predict_layers": "multi-token prediction",
               "attention_chunk_size": "chunked attention", "cross_attention_layers": "cross-attention layers"}
"""Keys that change the training cost of a model but that hybridpar does not model."""


def config_attention(raw: dict[str, Any], family: str) -> str:
    """The attention kind of a config: its attn_implementation (or _attn_implementation), else
    flash for the FLASH_FAMILIES and eager for the rest (BERT, GPT-2, T5, ViT, Swin as published)."""
    value = raw.get("attn_implementation", raw.get("_attn_implementation"))
    if value is None:
        return "flash" if family in FLASH_FAMILIES else "eager"
    if value not in ATTN_IMPLEMENTATIONS:
        raise SpecError("attn_implementation", f"must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; got {value!r}")
    return ATTN_IMPLEMENTATIONS[value]


def warn_unmodelled(raw: dict[str, Any], name: str) -> None:
    """One warning line per dtype or key the cost models do not account for."""
    dtype = raw.get("torch_dtype", raw.get("dtype"))
    if dtype is not None and str(dtype).removeprefix("torch.") not in TRAINED_DTYPES:
        log.warning("%s: torch_dtype %s is not modelled; planned in bf16 (the only precision today)", name, dtype)
    for key, what in UNREAD_KEYS.items():
        if raw.get(key) not in (None, 0, False, [], {}):
            log.warning("%s: %s (%s) is not modelled; planned without it", name, key, what)


def config_name(path: Path, raw: dict[str, Any]) -> str:
    """A model's name: the config's ``name``, else the last part of ``_name_or_path`` (the
    repository save_pretrained copied it from), else the folder of a ``config.json`` (as a
    Hugging Face repository is named), else the file's stem."""
    if raw.get("name"):
        return str(raw["name"])
    if raw.get("_name_or_path"):
        return Path(str(raw["_name_or_path"])).name
    if path.name == "config.json" and path.resolve().parent.name:
        return path.resolve().parent.name
    return path.stem
