"""parallelize(model, plan): the recipe that turns a ModelSpec and a Plan into this rank's
share of the model: build the stage, tensor parallel, checkpointing, relayouts, data
parallel, pipeline (torchtitan style, one apply_* step each)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from executor.execution import TIED_UNIT
from executor.model import build_block, build_embedding, build_head, is_tied, per_sample_loss
from executor.parallel.checkpoint import apply_ac
from executor.parallel.context import apply_cp
from executor.parallel.data import DataParallel, FlatBucket, apply_fsdp, local
from executor.parallel.expert import ExpertShard, apply_ep, build_expert_groups
from executor.parallel.layout import GroupCache, Layout, SplitLayout, SplitMeshes, stage_mesh
from executor.parallel.pipeline import apply_pp
from executor.parallel.relayout import Relayout, needs_relayout
from executor.parallel.sequence import apply_ulysses
from executor.parallel.tensor import apply_tp
from executor.parallel.vocab import VocabEmbedding, VocabHead, VocabSplit, tie_vocab, vocab_dp_parts, vocab_split
from executor.unsupported import refuse_unsupported
from specs import DPType, LayerStrategy, ModelSpec, Plan, split_ends


class StageModule(nn.Module):
    """Embedding (first stage), this stage's blocks with relayouts between them, head (last
    stage). Parameter names match executor.model.Transformer (plus wrapper prefixes)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed: nn.Module | None = None
        self.layers = nn.ModuleDict()
        self.relayouts = nn.ModuleDict()
        self.head: nn.Module | None = None
        self.order: list[tuple[str, str]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for kind, key in self.order:
            x = getattr(self, kind)(x) if key == "" else getattr(self, kind)[key](x)
        return x


@dataclass
class Unit:
    """A part of a stage whose states are accounted together (a block, the embedding, the
    head, the tied token weight) and how data parallelism treats it."""

    name: str
    dp_type: str
    """Effective type: "ddp" whenever dp == 1."""
    dp: int
    numel: int
    """Elements this rank holds before data parallelism (after tensor parallelism)."""
    module: nn.Module | None = None
    """The FSDP module (ZeRO-3), else None."""
    bucket: FlatBucket | None = None
    """The flat bucket (DDP, ZeRO-1/2), else None."""
    ignored: frozenset = frozenset()
    """Parameters of ``module`` that are not this unit's (the tied weight)."""
    trace: list | None = None
    """The data-parallel collectives it has run: (kind, elements of the full buffer, group
    size), its bucket's or its FSDP module's (None: it runs none)."""


class ChunkedStage(nn.Module):
    """The v model chunks one rank runs under interleaved 1F1B (``chunk<j>``: pipeline stage j)."""

    def __init__(self, chunks: dict[int, StageModule]) -> None:
        super().__init__()
        for j, chunk in chunks.items():
            self.add_module(f"chunk{j}", chunk)


@dataclass
class ParallelModel:
    """This rank's share of the model and what the training loop needs to drive it."""

    module: StageModule
    stage: int
    local_rank: int
    first_layout: Layout
    """Layout of the stage's first layer (which batch slice this rank feeds in)."""
    last_layout: Layout
    """Layout of the stage's last layer (which targets this rank scores)."""
    data_parallel: DataParallel
    units: list[Unit]
    schedule: object | None = None
    """Pipeline schedule (pp > 1) or None."""
    loss_fn: object = None
    """This rank's loss of a micro-batch (output, target) -> scalar tensor."""
    owns_loss: bool = True
    """Its loss counts in the reported global loss (one copy per replica, or every Ulysses share)."""
    padded_rows: dict[str, int] = field(default_factory=dict)
    """Parameter name -> real rows of a vocabulary-padded parameter (--check compares those)."""
    notes: list[str] = field(default_factory=list)
    groups: GroupCache | None = None
    """Every process group this rank's meshes use, one per distinct set of ranks."""


def build_meshes(plan: Plan, world_size: int, device: str, groups: GroupCache, split: VocabSplit | None = None
                 ) -> tuple[dict[Layout, object], object]:
    """Every layout's (pp, dp, tp) mesh (the layers' and the vocabulary's), every SplitLayout's
    SplitMeshes (the layers that split the sequence over cp or Ulysses) and the (pp, stage)
    mesh, built in the same order on every rank (process groups are created collectively,
    once per distinct set of ranks)."""
    layouts = {Layout.of(s) for s in plan.layers} | ({split.layout} if split else set())
    layouts = sorted(layouts, key=lambda l: (l.tp, l.dp, l.consecutive))
    meshes = {layout: layout.mesh(plan.pp, device, groups) for layout in layouts}
    smesh = stage_mesh(plan.pp, world_size, device, groups)
    splits = sorted({SplitLayout.of(s) for s in plan.layers if _splits_sequence(s)})
    meshes.update({layout: layout.meshes(plan.pp, device, groups, smesh) for layout in splits})
    return meshes, smesh


def _splits_sequence(s: LayerStrategy) -> bool:
    """Whether a layer's sequence is split over cp or Ulysses ranks (its groups: a SplitLayout)."""
    return s.cp > 1 or s.ulysses > 1


def parallelize(model: ModelSpec, plan: Plan, rank: int, world_size: int, *, seed: int = 0,
                device: str = "cpu", bf16: bool = False) -> ParallelModel:
    """The recipe: chunks (tensor parallel or Ulysses -> checkpointing -> relayouts) -> tied
    weights -> data parallel -> pipeline."""
    refuse_unsupported(plan, model)
    groups = GroupCache()
    per_stage = world_size // plan.pp
    split = vocab_split(plan, model, per_stage)
    meshes, smesh = build_meshes(plan, world_size, device.split(":")[0], groups, split)
    build_expert_groups(model, plan, groups)
    stage, local = divmod(rank, per_stage)
    ranges = plan.chunk_ranges()
    experts: dict[int, ExpertShard] = {}
    ep_place = (stage, local, groups, device.split(":")[0], experts)
    chunks = {j: _build_chunk(model, plan, ranges, j, meshes, smesh, seed, split, ep_place)
              for j in plan.stage_chunks(stage)}  # as the schedule places them (round-robin or a V)
    first, last = chunks[min(chunks)], chunks[max(chunks)]
    stage_module = first if len(chunks) == 1 else ChunkedStage(chunks)
    first_layout = Layout.of(plan.layers[_entry_layer(plan, min(chunks))])
    last_layout = Layout.of(plan.layers[plan.boundary_layer(max(chunks))])
    if split is not None:  # embedding and head run in the vocabulary layout
        first_layout = split.layout if first.embed is not None else first_layout
        last_layout = split.layout if last.head is not None else last_layout
    tied = _tie(first.embed, last.head, model, plan, seed, local, first_layout, last_layout, groups, smesh, split)
    stage_module.to(device)
    dp, units = _apply_data_parallel(list(chunks.values()), plan, meshes, smesh, bf16, tied, split, experts)
    loss_fn = make_loss_fn(plan.global_batch, last.head.per_sample_loss if split and last.head else per_sample_loss)
    schedule = None
    if plan.pp > 1:
        schedule = apply_pp(chunks, len(ranges), smesh["pp"].get_group(), torch.device(device),
                            plan.micro_batches, plan.schedule, loss_fn)
    owns_loss = split.owns_loss(local) if split else last_layout.tp_index(local) == 0
    return ParallelModel(module=stage_module, stage=stage, local_rank=local, first_layout=first_layout,
                         last_layout=last_layout, data_parallel=dp, units=units, schedule=schedule,
                         groups=groups, loss_fn=loss_fn, owns_loss=owns_loss,
                         padded_rows=split.padded_names() if split else {})


def _build_chunk(model: ModelSpec, plan: Plan, ranges: list[range], j: int, meshes: dict, smesh,
                 seed: int, split: VocabSplit | None, ep_place: tuple) -> StageModule:
    """Model chunk ``j``: embedding (first chunk), its blocks with relayouts between them, head
    (last chunk) or a relayout into the next chunk's first layout (pipeline sends lane to lane).
    ``ep_place`` = (stage, local rank, groups, device type, dict collecting expert shards)."""
    stage, local, groups, device_type, experts = ep_place
    ids = list(ranges[j])
    ends = split_ends(model, plan)  # the residual stream handed on split, block to block
    chunk = StageModule()
    if j == 0:
        chunk.embed = build_embedding(model, seed)
        chunk.order.append(("embed", ""))
        if split is not None:
            chunk.embed = VocabEmbedding(chunk.embed, split, meshes[split.layout]["tp"])
            _add_relayout(chunk, split.layout, Layout.of(plan.layers[_entry_layer(plan, j)]), smesh, "in")
    for pos, i in enumerate(ids):
        layout = Layout.of(plan.layers[i])
        if pos > 0:
            _add_relayout(chunk, Layout.of(plan.layers[ids[pos - 1]]), layout, smesh, f"{i}")
        block, strategy = build_block(model, i, seed), plan.layers[i]
        shard = apply_ep(block, model.layers[i], strategy, i, stage, local, groups, device_type)
        if shard is not None:
            experts[i] = shard
        sides = dict(zip(("split_in", "split_out"), ends[i]))
        if _splits_sequence(strategy):
            block = _apply_sequence_split(block, strategy, meshes[SplitLayout.of(strategy)], plan.cp_load_balance,
                                          model.layers[i].seq_len, **sides)
        else:
            block = apply_tp(block, meshes[layout]["tp"], sequence_parallel=strategy.megatron_sp, **sides)
        chunk.layers[str(i)] = apply_ac(block, strategy.recompute)
        chunk.order.append(("layers", str(i)))
    exit_layout = Layout.of(plan.layers[plan.boundary_layer(j)])
    if j == len(ranges) - 1:
        chunk.head = build_head(model, seed)
        if split is not None:
            chunk.head = VocabHead(chunk.head, split, meshes[split.layout]["tp"])
            _add_relayout(chunk, exit_layout, split.layout, smesh, "head")
        chunk.order.append(("head", ""))
    else:
        _add_relayout(chunk, exit_layout, Layout.of(plan.layers[_entry_layer(plan, j + 1)]), smesh, "out")
    return chunk


def _entry_layer(plan: Plan, j: int) -> int:
    """The layer whose layout chunk ``j``'s input arrives in: its first; a chunk of no layer,
    the layer after it (the embedding's chunk) or before it (the loss's)."""
    return min(plan.chunk_ranges()[j].start, len(plan.layers) - 1)


def _apply_sequence_split(block: nn.Module, s: LayerStrategy, groups: SplitMeshes, order: str, seq: int, *,
                          split_in: bool, split_out: bool) -> nn.Module:
    """tp (Megatron-SP too) inside, Ulysses around it, cp outermost: the input is cut over cp
    first, then over Ulysses (or tp's sequence split), and gathered back in reverse; Ulysses'
    all-to-alls run around the K/V ring (a2a+p2p). ``split_in``/``split_out``: the input arrives
    and the output leaves as this rank's chunk of all of those splits (no cut, no gather)."""
    split = dict(split_in=split_in, split_out=split_out)
    if groups.tp is not None:
        block = apply_tp(block, groups.tp, sequence_parallel=s.megatron_sp, **split)
    if groups.ulysses is not None:
        block = apply_ulysses(block, groups.ulysses, **split)
    if groups.cp is not None:
        block = apply_cp(block, groups.cp, s.cp_comm, order, seq, **split)
    return block


def make_loss_fn(global_batch: int, per_sample=per_sample_loss):
    """Sum of this rank's per-sample losses over the global batch: gradients sum exactly."""
    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return per_sample(output, target).sum() / global_batch
    return loss_fn


def _add_relayout(stage_module: StageModule, src: Layout, dst: Layout, smesh, key: str) -> None:
    if needs_relayout(src, dst):
        stage_module.relayouts[key] = Relayout(src, dst, smesh["stage"].get_group())
        stage_module.order.append(("relayouts", key))


def _tie(embed: nn.Module | None, head: nn.Module | None, model: ModelSpec, plan: Plan, seed: int, local: int,
         first: Layout, last: Layout, groups: GroupCache, smesh, split: VocabSplit | None
         ) -> tuple[nn.Parameter, object] | None:
    """Tied token weight (Megatron's way): one parameter when embedding and head share a stage,
    else an identical copy on the first and the last stage. Each TP group adds its gradient
    once (the copies on its other ranks are duplicates), and one SUM over the ranks of both
    ends gives every holder the whole gradient, so the copies stay equal. Returns the
    parameter and that group (None on stages that hold neither end)."""
    if not is_tied(model):
        return None
    ends = sorted({0, plan.head_stage})
    per_stage = smesh.size() // plan.pp
    if split is not None:
        return tie_vocab(embed, head, split, ends, per_stage, groups, lambda: build_embedding(model, seed))
    ranks = tuple(s * per_stage + j for s in ends for j in range(per_stage))
    group = groups.group([ranks])  # collective: every rank creates it
    if embed is None and head is None:
        return None
    if embed is not None:
        embed.token_weight_grad = first.tp_index(local) == 0
    if head is not None:
        head.out_weight_grad = last.tp_index(local) == 0
        if embed is not None:
            head.out.weight = embed.tokens.weight
        else:
            with torch.no_grad():
                head.out.weight.copy_(build_embedding(model, seed).tokens.weight)
    weight = embed.tokens.weight if embed is not None else head.out.weight
    return weight, group


def _dp_parts(chunks: list[StageModule], plan: Plan, meshes: dict, smesh, split: VocabSplit | None
              ) -> list[tuple[str, nn.Module, object, int, str, nn.Module | None]]:
    """(unit name, module, data-parallel mesh, degree, dp type, a submodule that is a unit of
    its own, listed before) of every block (its gradient group: dp, or cp * ulysses * dp), the
    embedding (like the first layer's replicas) and the head (like the last's), in the order
    the chunks run them."""
    parts, first, last = [], plan.layers[0], plan.layers[-1]  # the embedding's and the head's neighbours
    for chunk in chunks:
        ids = [int(k) for k in chunk.layers]
        if chunk.embed is not None and split is not None:
            parts += vocab_dp_parts("embedding", chunk.embed, split, meshes, smesh, first.dp_type)
        elif chunk.embed is not None:
            parts.append(("embedding", chunk.embed, meshes[Layout.of(first)]["dp"], first.dp, first.dp_type, None))
        for i in ids:
            s = plan.layers[i]
            # the grad-sync group: the ranks holding the same weight shard
            mesh = meshes[SplitLayout.of(s)].sync if _splits_sequence(s) else meshes[Layout.of(s)]["dp"]
            parts.append((f"layer {i}", chunk.layers[str(i)], mesh, s.degrees.grad_sync, s.dp_type, None))
        if chunk.head is not None and split is not None:
            parts += vocab_dp_parts("head", chunk.head, split, meshes, smesh, last.dp_type)
        elif chunk.head is not None:
            parts.append(("head", chunk.head, meshes[Layout.of(last)]["dp"], last.dp, last.dp_type, None))
    return parts


def _apply_data_parallel(chunks: list[StageModule], plan: Plan, meshes: dict, smesh, bf16: bool,
                         tied: tuple[nn.Parameter, object] | None, split: VocabSplit | None,
                         experts: dict[int, ExpertShard]) -> tuple[DataParallel, list[Unit]]:
    """A flat bucket (DDP, ZeRO-1/2) or FSDP (ZeRO-3) for each block, the embedding (like the
    first layer) and the head (like the last); the tied weight and each MoE layer's experts
    (over their expert-data-parallel group) get their own bucket."""
    dp = DataParallel(micro_batches=plan.micro_batches)
    dtype = torch.bfloat16 if bf16 else torch.float32
    skip = frozenset([tied[0]] if tied else []) | frozenset(p for e in experts.values() for p in e.params)
    units = []
    for name, module, dp_mesh, degree, dp_type, child in _dp_parts(chunks, plan, meshes, smesh, split):
        others = frozenset(child.parameters()) if child is not None else frozenset()  # after its FSDP
        params = [p for p in module.parameters() if p not in skip and p not in others]
        if not params:
            continue
        dp_type = dp_type if degree > 1 else DPType.DDP
        unit = Unit(name=name, dp_type=dp_type, dp=degree, numel=sum(local(p).numel() for p in params))
        if dp_type == DPType.ZERO3:
            ignored = (skip | others) & set(module.parameters())
            unit.trace = apply_fsdp(module, dp_mesh, dp, bf16, set(ignored))
            unit.module, unit.ignored = module, frozenset(ignored)
        else:
            unit.bucket = dp.add_bucket(params, dp_mesh.get_group(), dp_type, dtype)
            unit.trace = unit.bucket.trace
        units.append(unit)
    for i, e in experts.items():
        bucket = dp.add_bucket(e.params, e.group, e.dp_type, dtype)
        units.append(Unit(name=f"layer {i} experts", dp_type=e.dp_type, dp=e.dp, numel=e.numel, bucket=bucket,
                          trace=bucket.trace))
    dp.share_fsdp_comms()
    if tied:
        weight, group = tied
        # its group's ranks reach the tied weight's last use at different points of backward
        # (TP duplicates add nothing): reduce after it
        bucket = dp.add_bucket([weight], group, DPType.DDP, dtype, eager=False)
        units.append(Unit(name=TIED_UNIT, dp_type=DPType.DDP, dp=1, numel=local(weight).numel(),
                          bucket=bucket, trace=bucket.trace))
    return dp, units
