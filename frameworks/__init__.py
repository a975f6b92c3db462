"""Plans in the training frameworks' own formats: export to and import from Megatron-LM/Bridge,
torchtitan, DeepSpeed and Galvatron (one module each, behind frameworks.base.Framework)."""
from frameworks import deepspeed, galvatron, megatron, torchtitan  # noqa: F401  (registers them)
from frameworks.base import ExportResult, Framework, available, get

__all__ = ["ExportResult", "Framework", "available", "get"]
