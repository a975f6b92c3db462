"""Where the count model (planners/count_formulation.py) keeps each choice: the model's runs of
one layer type, its blocks (a run on a stage), and the index of the MILP's variables that reads
a plan back from a solution and turns a known plan into warm-start values."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specs import even_stage_layers


@dataclass(frozen=True)
class Run:
    """A maximal run of consecutive layers of one type."""

    type: int
    start: int
    """Its first layer."""
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length


def layer_runs(layer_type: np.ndarray) -> list[Run]:
    """The runs of ``layer_type`` (one type index per layer), in layer order."""
    out: list[Run] = []
    for l, ty in enumerate(layer_type.tolist()):
        if out and out[-1].type == ty:
            out[-1] = Run(ty, out[-1].start, out[-1].length + 1)
        else:
            out.append(Run(ty, l, 1))
    return out


@dataclass(frozen=True)
class Block:
    """Run j on stage k, as far as the stage windows allow it."""

    most: int
    """The most layers of the run the stage may hold."""
    forced: bool
    """The stage surely holds one of them (with ``even``: exactly ``most``)."""


def blocks(n: int, pp: int, even: bool, runs: list[Run]) -> dict[tuple[int, int], Block]:
    """(stage, run) -> Block, for every run that meets the layers its stage may hold. A stage may
    hold layers [k, n - pp + k] (stage 0 from 0, the last to n - 1) and surely holds those in
    every window: layer 0 (stage 0), layer n - 1 (the last stage), all of them when pp = 1."""
    out = {}
    sizes = np.concatenate(([0], np.cumsum(even_stage_layers(n, pp)))) if even else None
    for k in range(pp):
        if even:
            span = sure = (int(sizes[k]), int(sizes[k + 1]))
        else:
            span = (k, n - pp + k + 1)
            sure = (0 if k == 0 else n - pp + k, n if k == pp - 1 else k + 1)
        for j, run in enumerate(runs):
            most = min(span[1], run.stop) - max(span[0], run.start)
            if most > 0:
                within = run.start <= span[0] and span[1] <= run.stop
                meets_sure = min(sure[1], run.stop) > max(sure[0], run.start)
                out[(k, j)] = Block(most, within or meets_sure)
    return out


@dataclass
class CountIndex:
    """Where the count model keeps each choice, to read a plan back and to warm-start it."""

    runs: list[Run]
    strategies: dict[int, np.ndarray]
    """Per layer type: its allowed strategy indices (the s of n[k,j,q,s] indexes its run's)."""
    classes: dict[tuple[int, int], np.ndarray]
    """Per (stage, type): class of each allowed strategy."""
    slots: dict[tuple[int, int], int]
    """Per block (stage, run) that may hold layers: number of slots."""
    relayout_s: dict[tuple[int, int], np.ndarray]
    """Per (stage, type): class-to-class relayout times."""
    chained_s: dict[tuple[int, int], np.ndarray]
    """Per (stage, type): the cheapest chains of them (shortest_paths), which the model charges."""
    n: dict[tuple[int, int, int, int], str] = field(default_factory=dict)
    r: dict[tuple[int, int, int, int], str] = field(default_factory=dict)
    u: dict[tuple[int, int], str] = field(default_factory=dict)
    done: dict[tuple[int, int], str] = field(default_factory=dict)
    first: dict[tuple[int, int, int], str] = field(default_factory=dict)
    last: dict[tuple[int, int, int], str] = field(default_factory=dict)
    presence: dict[tuple[int, int, int], str] = field(default_factory=dict)
    single: dict[tuple[int, int], str] = field(default_factory=dict)

    def read_plan(self, values: dict[str, float], n_layers: int, pp: int) -> tuple[list[int], list[int]]:
        """(strategy per layer, layers per stage): each stage's blocks in run order, each block's
        slots in order, its first and last strategies where the solution put them."""
        choice: list[int] = []
        sizes = []
        for k in range(pp):
            stage = [g for j in range(len(self.runs)) if (k, j) in self.slots for g in self._block(values, k, j)]
            choice += stage
            sizes.append(len(stage))
        assert len(choice) == n_layers, (len(choice), n_layers)
        return choice, sizes

    def _block(self, values, k, j) -> list[int]:
        """Block (k, j)'s strategy indices in layer order."""
        runs = [self._slot(values, k, j, q) for q in range(self.slots[(k, j)])]
        runs = [run for run in runs if run]
        if not runs:
            return []
        first, last = of_block(self.first, k, j), of_block(self.last, k, j)
        if first:
            _to_front(runs[0], _chosen(values, first))
        if last:
            _to_back(runs[-1], _chosen(values, last), keep_front=bool(first) and len(runs) == 1)
        return [int(self.strategies[self.runs[j].type][s]) for run in runs for s in run]

    def _slot(self, values, k, j, q) -> list[int]:
        out = []
        for s in range(len(self.strategies[self.runs[j].type])):
            out += [s] * int(round(values.get(self.n[(k, j, q, s)], 0.0)))
        return out

    def takes_a_shortcut(self, choice: list[int], stage_layers: list[int]) -> bool:
        """Whether the plan relayouts inside a block between two classes whose direct relayout
        costs more than a chain through others: the model charged it the chain, so its objective
        is a lower bound there, not the plan's time."""
        stage = np.repeat(np.arange(len(stage_layers)), stage_layers)
        for j, run in enumerate(self.runs):
            for l in range(run.start + 1, run.stop):
                k = int(stage[l])
                if stage[l - 1] != k:
                    continue
                c, d = (int(self.classes[(k, run.type)][self._local(run.type, choice[i])]) for i in (l - 1, l))
                if self.chained_s[(k, run.type)][c, d] < self.relayout_s[(k, run.type)][c, d]:
                    return True
        return False

    def _local(self, ty: int, g: int) -> int | None:
        """Index of strategy g among type ty's allowed ones (None where it is not allowed)."""
        allowed = self.strategies[ty]
        i = int(np.searchsorted(allowed, g))
        return i if i < len(allowed) and allowed[i] == g else None

    def warm_values(self, choice: list[int], stage_layers: list[int]) -> dict[str, float]:
        """The integer variables' values for a known plan, or {} when a block has more slot runs
        than slots (or a layer a strategy its type does not allow)."""
        names = (self.n, self.r, self.u, self.done, self.first, self.last, self.presence, self.single)
        out = {name: 0.0 for d in names for name in d.values()}
        bounds = np.concatenate(([0], np.cumsum(stage_layers)))
        for k in range(len(stage_layers)):
            for j, run in enumerate(self.runs):
                lo, hi = max(int(bounds[k]), run.start), min(int(bounds[k + 1]), run.stop)
                if lo < hi and not self._warm_block(out, k, j, choice[lo:hi]):
                    return {}
                if (k, j) in self.done:
                    out[self.done[(k, j)]] = float(bounds[k + 1] >= run.stop)
        return out

    def _warm_block(self, out: dict, k: int, j: int, layers: list[int]) -> bool:
        ty = self.runs[j].type
        block = [self._local(ty, g) for g in layers]
        if (k, j) not in self.slots or None in block:
            return False
        runs = _runs(block, self.classes[(k, ty)])
        if len(runs) > self.slots[(k, j)]:
            return False
        out[self.u[(k, j)]] = 1.0
        for q, run in enumerate(runs):
            out[self.r[(k, j, q, int(self.classes[(k, ty)][run[0]]))]] = 1.0
            for s in run:
                out[self.n[(k, j, q, s)]] += 1.0
                out[self.presence[(k, ty, s)]] = 1.0
        for names, s in ((self.first, block[0]), (self.last, block[-1])):
            if (k, j, s) in names:
                out[names[(k, j, s)]] = 1.0
        if (k, j) in self.single:
            out[self.single[(k, j)]] = float(len(block) == 1)
        return True


def of_block(names: dict, k: int, j: int) -> dict[int, str]:
    """Block (k, j)'s entries of a dict keyed (stage, run, strategy), by strategy."""
    return {s: name for (kk, jj, s), name in names.items() if (kk, jj) == (k, j)}


def _chosen(values, names: dict) -> int:
    return max(names, key=lambda s: values.get(names[s], 0.0))


def _runs(stage: list[int], cls: np.ndarray) -> list[list[int]]:
    runs: list[list[int]] = []
    for s in stage:
        if runs and cls[runs[-1][0]] == cls[s]:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def _to_front(run: list[int], s: int) -> None:
    run.remove(s)
    run.insert(0, s)


def _to_back(run: list[int], s: int, keep_front: bool) -> None:
    """Move one layer of s to the run's end; with ``keep_front`` not the run's first layer
    (the block's first), unless it is the run's only one."""
    lowest = 1 if keep_front and len(run) > 1 else 0
    j = max(i for i in range(lowest, len(run)) if run[i] == s)
    run.append(run.pop(j))
