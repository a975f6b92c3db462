"""PyTorch runtime for a Plan: parallelize a ModelSpec's Transformer (TP, DDP/ZeRO, PP,
checkpointing, relayouts), run and measure it, profile the hardware (validation against predictions: analysis.validate)."""
import importlib

_EXPORTS = {"run_plan": "executor.run", "Measurement": "executor.run", "parallelize": "executor.parallelize",
            "launch": "executor.launch", "LaunchError": "executor.launch", "CheckResult": "executor.reference"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # lazy, so ``python -m executor.run`` does not import executor.run twice
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
