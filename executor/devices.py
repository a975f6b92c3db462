"""Which device a run uses, decided without any CUDA call in this process: the ranks start
afterwards and each must be the first to initialise CUDA (on its own GPU, local rank)."""
from __future__ import annotations

import functools
import os
import subprocess
import sys

from specs import SpecError

DEVICES = ("cpu", "cuda")


@functools.cache
def visible_gpus() -> int:
    """CUDA GPUs a rank would see: 0 for a CPU-only torch build or CUDA_VISIBLE_DEVICES="";
    otherwise counted by torch.cuda.device_count() in a throw-away subprocess."""
    if not cuda_build() or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                          capture_output=True, text=True, timeout=120)
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


@functools.cache
def gpu_identity() -> tuple[str, int]:
    """(name, total memory bytes) of GPU 0, read in a throw-away subprocess as ``visible_gpus``;
    ("", 0) where none is visible."""
    if visible_gpus() == 0:
        return "", 0
    code = "import torch; p = torch.cuda.get_device_properties(0); print(p.total_memory); print(p.name)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return "", 0
    memory, name = done.stdout.strip().split("\n", 1)
    return name.strip(), int(memory)


def cuda_build() -> bool:
    """This torch was built with CUDA (build metadata: reading it initialises nothing)."""
    import torch
    return torch.version.cuda is not None


def resolve_device(requested: str | None) -> tuple[str, str]:
    """("cpu" or "cuda", the one line that says why). None: cuda when a GPU is visible."""
    if requested not in (None, *DEVICES):
        raise SpecError("--device", f"must be cpu or cuda, got {requested!r}")
    gpus = visible_gpus() if requested != "cpu" else 0
    if requested == "cuda" and gpus == 0:
        raise SpecError("--device", "cuda asked for but no CUDA GPU is visible")
    if requested is None:
        device = "cuda" if gpus else "cpu"
        why = f"{gpus} CUDA GPU(s) visible" if gpus else "no CUDA GPU visible"
        return device, f"device: {device} (default: {why})"
    return requested, f"device: {requested} (asked for)"
