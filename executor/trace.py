"""The model-parallel collectives a rank runs, per layer: tensor-parallel all-reduces, Megatron-SP
all-gathers and reduce-scatters, Ulysses all-to-alls, context parallelism's ring sends and
receives (or K/V all-gathers) and the pipeline's stage sends and receives, in the vocabulary of
the data-parallel trace (kind, elements of one rank's buffer, group size) and compared by --check
with what the cost model charges (executor.execution.collective_errors).

A TorchDispatchMode sees every c10d op the rank dispatches (``torch.ops.c10d.*`` from
torch.distributed's calls, ``torch.ops._c10d_functional.*`` from DTensor's redistributions and
functional collectives); DTensor ops are handed back (NotImplemented) so that the mode sees the
collectives DTensor desugars them into. Each op is put on the layer whose block is running:
a forward pre-hook (first of the block's, before its sequence cut) and a forward hook (last,
after its gather) bracket the forward, and gradient hooks on the block's input and output
tensors bracket its backward (recomputation runs inside it); the embedding, relayouts, the head
and the vocabulary-parallel loss are bracketed the same way (executor.train.collective_trace).
Pipeline sends and receives go to the stage boundary they cross, read off the peer's stage.

The data-parallel collectives are traced by their buckets (executor.parallel.data) and left
out here: each of those appends one record to its unit's trace right before it starts its one
collective, so an op that arrives while the units' traces hold more records than have been
matched is that record's.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

OPS = {
    # c10d (torch.distributed's eager calls): op name -> recorded kind
    "allreduce_": "all_reduce", "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather", "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter", "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    # _c10d_functional (DTensor, funcol)
    "all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}


def _numel(x) -> int:
    if isinstance(x, (list, tuple)):
        return sum(_numel(t) for t in x)
    return x.numel() if isinstance(x, torch.Tensor) else 0


def _process_group(a) -> dist.ProcessGroup | None:
    """A c10d op's ProcessGroup argument (boxed as a ScriptObject at the dispatcher)."""
    if isinstance(a, dist.ProcessGroup):
        return a
    if isinstance(a, torch.ScriptObject) and a._type().qualified_name().endswith(".ProcessGroup"):
        return dist.ProcessGroup.unbox(a)
    return None


def _group_size(args, kwargs) -> int:
    """The group's size: c10d ops carry the ProcessGroup, functional ones its name (last string)."""
    values = list(args) + list((kwargs or {}).values())
    for a in values:
        if _process_group(a) is not None:
            return _process_group(a).size()
    names = [a for a in values if isinstance(a, str)]  # (reduce op,) group name: the last
    return dist.distributed_c10d._resolve_process_group(names[-1]).size() if names else 0


def _peer(args) -> tuple[int, dist.ProcessGroup] | None:
    """(peer's rank in the group, group) of a c10d send or recv_."""
    group = next((_process_group(a) for a in args if _process_group(a) is not None), None)
    ints = [a for a in args if isinstance(a, int)]
    return (ints[0], group) if group is not None and ints else None


INPUT_SIZED = {"reduce_scatter_", "_reduce_scatter_base_", "alltoall_", "alltoall_base_"}
"""c10d ops whose recorded buffer is their second argument (the input; the first is the output)."""


def _elements(name: str, args) -> int:
    """Elements of one rank's buffer: the reduced or exchanged input, the gathered result (an
    all-gather's output), the sent or received tensor."""
    if name == "all_gather_into_tensor":  # (input, group size, group name)
        return _numel(args[0]) * int(args[1])
    return _numel(args[1] if name in INPUT_SIZED else args[0])


def _is_metadata(args) -> bool:
    """A collective of integer tensors, not a plan's activation or gradient: torch.pipelining's
    shape inference exchanging the stage's output shapes as pickled objects (size, bytes) on
    the first step, expert parallelism's routing counts (E integers per rank before each
    dispatch, so that every rank knows its split sizes)."""
    tensors = args[0] if args and isinstance(args[0], (list, tuple)) else args[:1]
    return all(isinstance(t, torch.Tensor) and not t.is_floating_point() for t in tensors)


def _on_gradient(x, fn: Callable[[], None]) -> None:
    """Run ``fn`` when backward reaches ``x``'s gradient: a hook on the tensor, which adds no node
    to the graph that torch.pipelining's split backward (stage_backward_input) walks."""
    if isinstance(x, torch.Tensor) and x.requires_grad:
        x.register_hook(lambda _grad: fn())


class CollectiveTrace(TorchDispatchMode):
    """``with trace:`` records (kind, elements, group size) per layer key ("layer 3") of every
    model-parallel collective; pipeline sends and receives under "boundary <layer>" (the last
    layer before the boundary). ``dp_traces``: the units' data-parallel trace lists (whose
    collectives are left out)."""

    def __init__(self, dp_traces: list[list]) -> None:
        super().__init__()
        self.dp_traces = dp_traces
        self.records: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        self.key: str | None = None
        """Where the running collectives go ("layer 3", "layer 3 experts"; None: between blocks)."""
        self._stack: list[str | None] = []
        self._dp_matched = 0
        self._boundaries: dict[int, str] = {}  # peer stage offset (+1, -1) -> key
        self._per_stage = 1
        self._watched: list[str] = []

    # -- attribution -----------------------------------------------------------------------
    def watch_block(self, i: int, block: nn.Module) -> None:
        """Put what runs inside ``block`` (forward and backward) on layer ``i``, and what runs
        inside its MoE (the expert all-to-alls, the experts' tensor-parallel all-reduces) on
        "layer i experts"."""
        self.watch_module(block, f"layer {i}")
        mlp = getattr(block, "mlp", None)
        if mlp is not None and hasattr(mlp, "experts"):
            self._watched.append(f"layer {i} experts")
            self._watch(mlp, f"layer {i} experts", f"layer {i}")

    def watch_module(self, module: nn.Module, key: str) -> None:
        """Put what runs inside ``module`` (forward and backward) on ``key``: a block ("layer
        3"), a relayout ("relayout 3": into layer 3), the head, the loss."""
        if key not in self._watched:
            self._watched.append(key)
        self._watch(module, key, None)

    def watch_embedding(self, module: nn.Module) -> None:
        """Put what the embedding runs on "embedding". Its input (token ids) has no gradient:
        its backward ends at the gradient of the first differentiable output one of its
        submodules makes (the token lookup's), which comes after every collective it runs."""
        self.watch_module(module, "embedding")
        pending = []

        def enter(_module, _args):
            pending[:] = [True]

        def made(_module, _args, out):
            if pending and isinstance(out, torch.Tensor) and out.requires_grad:
                pending.clear()
                _on_gradient(out, lambda: self._leave_backward("embedding", None))
        module.register_forward_pre_hook(enter)
        for sub in module.modules():
            if sub is not module:
                sub.register_forward_hook(made)

    def _watch(self, module: nn.Module, key: str, parent: str | None) -> None:
        def enter(_module, args):
            self._stack.append(self.key)
            self.key = key
            _on_gradient(args[0], lambda: self._leave_backward(key, parent))

        def leave(_module, _args, out):
            self.key = self._stack.pop() if self._stack else parent
            _on_gradient(out, lambda: self._set(key))
        module.register_forward_pre_hook(enter, prepend=True)
        module.register_forward_hook(leave)

    def _set(self, key: str | None) -> None:
        self.key = key

    def _leave_backward(self, key: str, parent: str | None) -> None:
        """The block's input gradient is made: its backward ends, unless the previous block's
        output (the same tensor, whose hook ran first) has already started that one's."""
        if self.key == key:
            self.key = parent

    def watch_stage(self, stage: int, pp: int, first_layer: int, last_layer: int) -> None:
        """Pipeline p2p of this rank's (one) stage: to or from the next stage crosses the boundary
        after ``last_layer``, the previous one's the boundary after ``first_layer - 1`` (told
        apart from sends inside the stage by the peer's stage)."""
        self._per_stage = dist.get_world_size() // pp
        if stage + 1 < pp:
            self._boundaries[1] = f"boundary {last_layer}"
        if stage > 0:
            self._boundaries[-1] = f"boundary {first_layer - 1}"
        self._watched += sorted(set(self._boundaries.values()) - set(self._watched))

    # -- dispatch ----------------------------------------------------------------------------
    def _is_data_parallel(self) -> bool:
        started = sum(len(t) for t in self.dp_traces)
        if started > self._dp_matched:
            self._dp_matched += 1
            return True
        return False

    def __enter__(self):
        """Begin a step: the data-parallel records already there are matched."""
        self._dp_matched = sum(len(t) for t in self.dp_traces)
        self.records.clear()
        self._stack.clear()
        self.key = None
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor desugar into the collectives recorded here
        namespace = func.namespace
        name = func._schema.name.split("::")[-1]
        kind = OPS.get(name) if namespace in ("c10d", "_c10d_functional") else None
        if kind is not None and not self._is_data_parallel() and not _is_metadata(args):
            self._record(kind, name, args, kwargs)
        return func(*args, **(kwargs or {}))

    def _record(self, kind: str, name: str, args, kwargs) -> None:
        size = _group_size(args, kwargs)
        elements = _elements(name, args)
        key = self._boundary(args) if kind in ("send", "recv") else None
        key = key or (self.key if self.key is not None else "outside layers")
        self.records[key].append((kind, elements, size))

    def _boundary(self, args) -> str | None:
        """The stage boundary a send or receive crosses (its peer on the next or the previous
        stage); None for one inside the stage (cp's ring)."""
        peer = _peer(args)
        if peer is None or peer[1] is None or not self._boundaries:
            return None
        other = dist.get_global_rank(peer[1], peer[0]) // self._per_stage
        mine = dist.get_rank() // self._per_stage
        if other == mine:
            return None
        return self._boundaries.get(1 if other > mine else -1, "outside layers")

    def record(self) -> dict[str, list[tuple[str, int, int]]]:
        """The step's records per key: every watched module and boundary (empty if it ran none),
        and "outside layers" (an interleaved pipeline's sends), which nothing is compared with."""
        keys = self._watched + [k for k in self.records if k not in self._watched]
        return {k: list(self.records.get(k, [])) for k in keys}
