"""Where a layer's shards live: the (tp, dp, consecutive) layout of a stage and its device meshes."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh

from specs import LayerStrategy


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the G ranks of a stage are split into TP groups (same batch slice) and DP replicas."""

    tp: int
    """Tensor parallel degree."""
    dp: int
    """Data parallel degree (tp * dp = ranks per stage)."""
    consecutive: bool = True
    """TP groups on neighbouring ranks (else strided); irrelevant when tp or dp is 1."""

    def __post_init__(self) -> None:
        if self.tp == 1 or self.dp == 1:  # both layouts coincide: one canonical form
            object.__setattr__(self, "consecutive", True)

    @classmethod
    def of(cls, strategy: LayerStrategy) -> "Layout":
        return cls(tp=strategy.tp, dp=strategy.dp, consecutive=strategy.tp_consecutive)

    def local_rank(self, dp_index: int, tp_index: int) -> int:
        """Position inside the stage of the rank holding batch slice dp_index, shard tp_index."""
        return dp_index * self.tp + tp_index if self.consecutive else tp_index * self.dp + dp_index

    def dp_index(self, local: int) -> int:
        return local // self.tp if self.consecutive else local % self.dp

    def tp_index(self, local: int) -> int:
        return local % self.tp if self.consecutive else local // self.dp

    def same_slices(self, other: "Layout") -> bool:
        """True when every rank holds the same batch slice under both layouts (no relayout)."""
        g = self.tp * self.dp
        return self.dp == other.dp and all(self.dp_index(j) == other.dp_index(j) for j in range(g))

    def mesh(self, pp: int, device: str) -> DeviceMesh:
        """A (pp, dp, tp) mesh over the whole world; every rank must build it, in the same order."""
        g = self.tp * self.dp
        grid = torch.tensor([[[s * g + self.local_rank(d, t) for t in range(self.tp)]
                              for d in range(self.dp)] for s in range(pp)])
        return DeviceMesh(device, grid, mesh_dim_names=("pp", "dp", "tp"))


def stage_mesh(pp: int, world_size: int, device: str) -> DeviceMesh:
    """A (pp, stage) mesh: 'stage' groups the ranks of one stage, 'pp' one lane across stages."""
    grid = torch.arange(world_size).view(pp, world_size // pp)
    return DeviceMesh(device, grid, mesh_dim_names=("pp", "stage"))
