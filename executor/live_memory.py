"""Peak bytes of live tensor storages on CPU, for what MemTracker cannot follow.

torch's MemTracker attributes memory to modules through backward hooks on their inputs, and those
hooks cannot run under ``torch.autograd.grad`` on leaf inputs, which is how
``torch.distributed.pipelining`` runs a split backward's input-gradient half (ZB-H1, ZB-V,
DualPipeV: "A leaf node was passed to _will_engine_execute_node"). Only the global peak is read,
so this tracker keeps no module view: every storage an op creates (and every tensor given to
``track``) counts at its current size from when it is first seen until it is freed. On plans
MemTracker follows it reads the same peaks to 1 MiB (pp 2 1F1B and GPipe, ZeRO-3 dp 2, tp 2 with
recompute, on the schedules benchmark's CPU model).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class LiveStorageBytes(TorchDispatchMode):
    """``with tracker:`` counts the storages the ops create; ``peak_bytes`` is the most alive at
    once, the tensors passed to ``track`` (parameters, optimizer states) included. Sizes are read
    after every op, so storages resized in place (FSDP2 frees its unsharded parameters so) count
    at their current size."""

    def __init__(self) -> None:
        super().__init__()
        self.peak_bytes = 0
        self._storages: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def track(self, tensors: Iterable[Any]) -> None:
        """Count these tensors' storages (and any nested in containers) as alive now."""
        self._add(tensors)

    @property
    def live_bytes(self) -> int:
        return sum(storage.nbytes() for storage in self._storages.keys())

    def _add(self, tree: Any) -> None:
        for leaf in tree_flatten(tree)[0]:
            if isinstance(leaf, torch.Tensor):
                for storage in get_untyped_storages(leaf):
                    if storage.device.type != "meta":
                        self._storages[storage] = True
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        out = func(*args, **(kwargs or {}))
        self._add(out)
        return out
