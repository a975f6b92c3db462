"""Where a layer's shards live: the batch-slice layout of a stage (a view of specs.grid's RankGrid)
and the device meshes built from the grid's groups."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from specs import LayerStrategy, RankGrid, stage_grid


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the G ranks of a stage are split into groups that share a batch slice (tp, or a
    Ulysses group) and DP replicas: the key of the meshes, a view of the layer's RankGrid."""

    tp: int
    """Ranks sharing one batch slice: the tp degree, or the Ulysses degree (Degrees.split)."""
    dp: int
    """Data parallel degree (tp * dp = ranks per stage)."""
    consecutive: bool = True
    """TP groups on neighbouring ranks (else strided); irrelevant when tp or dp is 1."""

    def __post_init__(self) -> None:
        if self.tp == 1 or self.dp == 1:  # both layouts coincide: one canonical form
            object.__setattr__(self, "consecutive", True)

    @classmethod
    def of(cls, strategy: LayerStrategy) -> "Layout":
        return cls(tp=strategy.degrees.split, dp=strategy.dp, consecutive=strategy.tp_consecutive)

    def grid(self, first_rank: int = 0) -> RankGrid:
        """The (tp, dp) grid of a stage starting at ``first_rank``."""
        return stage_grid(first_rank, self.tp * self.dp, self.tp, self.consecutive)

    def local_rank(self, dp_index: int, tp_index: int) -> int:
        """Position inside the stage of the rank holding batch slice dp_index, shard tp_index."""
        return self.grid().rank(tp=tp_index, dp=dp_index)

    def dp_index(self, local: int) -> int:
        return self.grid().coords(local)["dp"]

    def tp_index(self, local: int) -> int:
        return self.grid().coords(local)["tp"]

    def same_slices(self, other: "Layout") -> bool:
        """True when every rank holds the same batch slice under both layouts (no relayout)."""
        g = self.tp * self.dp
        return self.dp == other.dp and all(self.dp_index(j) == other.dp_index(j) for j in range(g))

    def mesh(self, pp: int, device: str, groups: "GroupCache") -> DeviceMesh:
        """A (pp, dp, tp) mesh over the whole world; every rank must build it, in the same order."""
        g, grid = self.tp * self.dp, self.grid()
        ranks = torch.tensor([[[s * g + grid.rank(tp=t, dp=d) for t in range(self.tp)]
                               for d in range(self.dp)] for s in range(pp)])
        return groups.mesh(ranks, device, ("pp", "dp", "tp"))


class GroupCache:
    """One process group per distinct set of ranks, reused by every mesh that has it (a pp lane,
    a stage, a TP group shared by two layouts): created collectively, in the same order on
    every rank."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def group(self, all_sets: list[tuple[int, ...]]) -> dist.ProcessGroup | None:
        """Create whichever of ``all_sets`` is new; the group of the set holding this rank
        (None if none does)."""
        rank = dist.get_rank()
        for ranks in all_sets:
            if ranks not in self.groups:
                self.groups[ranks] = dist.new_group(list(ranks))
        return next((self.groups[r] for r in all_sets if rank in r), None)

    def mesh(self, grid: torch.Tensor, device: str, names: tuple[str, ...]) -> DeviceMesh:
        """A DeviceMesh over ``grid`` whose dimension groups come from this cache."""
        dims = []
        for dim in range(grid.dim()):
            lines = grid.movedim(dim, -1).reshape(-1, grid.shape[dim])
            dims.append(self.group([tuple(int(r) for r in line) for line in lines]))
        return DeviceMesh.from_group(dims, device, mesh=grid, mesh_dim_names=names)


def stage_mesh(pp: int, world_size: int, device: str, groups: GroupCache) -> DeviceMesh:
    """A (pp, stage) mesh: 'stage' groups the ranks of one stage, 'pp' one lane across stages."""
    grid = torch.arange(world_size).view(pp, world_size // pp)
    return groups.mesh(grid, device, ("pp", "stage"))
