"""Where a layer's shards live: the batch-slice layout of a stage and, for a layer that splits the
sequence (cp, Ulysses), how its batch-slice group splits further (both views of specs.grid's
RankGrid), and the device meshes and process groups built from the grid's groups."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from specs import GRAD_SYNC_AXES, Degrees, LayerStrategy, RankGrid, layer_grid, stage_grid


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the G ranks of a stage are split into groups that share a batch slice (tp, or a
    Ulysses group) and DP replicas: the key of the meshes, a view of the layer's RankGrid."""

    tp: int
    """Ranks sharing one batch slice: Degrees.split, tp * cp * ulysses (SplitLayout says how a
    layer that splits the sequence divides them)."""
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


@dataclass(frozen=True, kw_only=True, order=True)
class SplitLayout:
    """A layer whose batch-slice group (``Layout.tp`` ranks) splits the sequence over cp or Ulysses
    ranks, beside tp or not: which ranks split the weights (tp), the sequence (cp, ulysses) and
    hold the same weight shard (cp, ulysses and dp: the gradient-sync group), in the RankGrid's
    axis order (tp fastest, then cp, then ulysses; dp first when strided)."""

    tp: int = 1
    cp: int = 1
    ulysses: int = 1
    dp: int = 1
    consecutive: bool = True
    """The batch-slice group on neighbouring ranks (else strided by dp); irrelevant when dp is 1."""

    def __post_init__(self) -> None:
        if self.dp == 1:  # both layouts coincide: one canonical form
            object.__setattr__(self, "consecutive", True)

    @classmethod
    def of(cls, strategy: LayerStrategy) -> "SplitLayout":
        return cls(tp=strategy.tp, cp=strategy.cp, ulysses=strategy.ulysses, dp=strategy.dp,
                   consecutive=strategy.tp_consecutive)

    def grid(self) -> RankGrid:
        """The layer's grid on a stage starting at rank 0."""
        return layer_grid(0, Degrees(tp=self.tp, cp=self.cp, ulysses=self.ulysses, dp=self.dp,
                                     tp_consecutive=self.consecutive))

    def sets(self, pp: int, names: str) -> list[tuple[int, ...]]:
        """Every stage's groups over the axes ``names``: the grid's, offset by the stage."""
        grid = self.grid()
        return [tuple(s * grid.size + r for r in group) for s in range(pp) for group in grid.groups(names)]

    def table(self, pp: int) -> torch.Tensor:
        """The (pp, sync, tp) ranks: rows are the tp groups (tp index ascending), columns the
        gradient-sync groups (ranks ascending, so that a mesh coordinate is the rank's number
        in its process group)."""
        grid = self.grid()
        sync = torch.tensor(grid.groups(GRAD_SYNC_AXES)).T
        return torch.stack([sync + s * grid.size for s in range(pp)])

    def meshes(self, pp: int, device: str, groups: "GroupCache", smesh: DeviceMesh) -> "SplitMeshes":
        """This rank's groups of the layout; every rank must build them, in the same order. With
        tp 1 the gradient-sync group is the stage (``smesh``'s)."""
        cp = groups.group(self.sets(pp, "cp")) if self.cp > 1 else None
        ulysses = groups.group(self.sets(pp, "ulysses")) if self.ulysses > 1 else None
        if self.tp == 1:
            return SplitMeshes(sync=smesh["stage"], tp=None, cp=cp, ulysses=ulysses)
        mesh = groups.mesh(self.table(pp), device, ("pp", "sync", "tp"))
        return SplitMeshes(sync=mesh["sync"], tp=mesh["tp"], cp=cp, ulysses=ulysses)


@dataclass(frozen=True)
class SplitMeshes:
    """This rank's groups of a SplitLayout."""

    sync: DeviceMesh
    """The ranks holding the same weight shard: gradient sync and ZeRO (FSDP2 takes a mesh that
    shares its root with ``tp``)."""
    tp: DeviceMesh | None
    """The ranks splitting the weights (None: tp 1)."""
    cp: dist.ProcessGroup | None
    """The K/V ring's ranks, in ring order (None: cp 1)."""
    ulysses: dist.ProcessGroup | None
    """The all-to-all's ranks (None: no Ulysses)."""


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
