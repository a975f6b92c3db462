"""parallelize(model, plan): the recipe that turns a ModelSpec and a Plan into this rank's
share of the model: build the stage, tensor parallel, checkpointing, relayouts, data
parallel, pipeline (torchtitan style, one apply_* step each)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from executor.model import build_block, build_embedding, build_head, is_tied, per_sample_loss
from executor.parallel.checkpoint import apply_ac
from executor.parallel.data import DataParallel, FlatBucket, apply_fsdp, local
from executor.parallel.expert import ExpertShard, apply_ep, build_expert_groups
from executor.parallel.layout import GroupCache, Layout, stage_mesh
from executor.parallel.pipeline import apply_pp
from executor.parallel.relayout import Relayout, needs_relayout
from executor.parallel.tensor import apply_tp
from executor.unsupported import refuse_unsupported, vocab_notes
from specs import DPType, ModelSpec, Plan


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
    notes: list[str] = field(default_factory=list)
    groups: GroupCache | None = None
    """Every process group this rank's meshes use, one per distinct set of ranks."""


def build_meshes(plan: Plan, world_size: int, device: str, groups: GroupCache) -> tuple[dict[Layout, object], object]:
    """Every layout's (pp, dp, tp) mesh and the (pp, stage) mesh, built in the same order on
    every rank (process groups are created collectively, once per distinct set of ranks)."""
    layouts = sorted({Layout.of(s) for s in plan.layers}, key=lambda l: (l.tp, l.dp, l.consecutive))
    meshes = {layout: layout.mesh(plan.pp, device, groups) for layout in layouts}
    return meshes, stage_mesh(plan.pp, world_size, device, groups)


def parallelize(model: ModelSpec, plan: Plan, rank: int, world_size: int, *, seed: int = 0,
                device: str = "cpu", bf16: bool = False) -> ParallelModel:
    """The recipe: stage -> tensor parallel -> checkpointing -> relayouts -> tied weights ->
    data parallel -> pipeline."""
    refuse_unsupported(plan)
    groups = GroupCache()
    meshes, smesh = build_meshes(plan, world_size, device.split(":")[0], groups)
    build_expert_groups(model, plan, groups)
    per_stage = world_size // plan.pp
    stage, local = divmod(rank, per_stage)
    ids = list(plan.stage_ranges()[stage])
    layouts = {i: Layout.of(plan.layers[i]) for i in ids}
    stage_module = StageModule()
    experts: dict[int, ExpertShard] = {}
    if stage == 0:
        stage_module.embed = build_embedding(model, seed)
        stage_module.order.append(("embed", ""))
    for pos, i in enumerate(ids):
        if pos > 0:
            _add_relayout(stage_module, layouts[ids[pos - 1]], layouts[i], smesh, f"{i}")
        block = build_block(model, i, seed)
        shard = apply_ep(block, model.layers[i], plan.layers[i], i, stage, local, groups, device.split(":")[0])
        if shard is not None:
            experts[i] = shard
        block = apply_tp(block, meshes[layouts[i]]["tp"], sequence_parallel=plan.layers[i].megatron_sp)
        block = apply_ac(block, plan.layers[i].recompute)
        stage_module.layers[str(i)] = block
        stage_module.order.append(("layers", str(i)))
    if stage == plan.pp - 1:
        stage_module.head = build_head(model, seed)
        stage_module.order.append(("head", ""))
    else:  # hand the next stage its input already in its first layer's layout
        _add_relayout(stage_module, layouts[ids[-1]], Layout.of(plan.layers[ids[-1] + 1]), smesh, "out")
    tied = _tie(stage_module, model, plan, seed, local, layouts[ids[0]], layouts[ids[-1]], groups, smesh)
    stage_module.to(device)
    dp, units = _apply_data_parallel(stage_module, plan, ids, meshes, bf16, tied, experts)
    schedule = None
    if plan.pp > 1:
        loss_fn = make_loss_fn(plan.global_batch)
        schedule = apply_pp(stage_module, stage, plan.pp, smesh["pp"].get_group(), torch.device(device),
                            plan.micro_batches, plan.schedule, loss_fn)
    notes = vocab_notes(plan)
    return ParallelModel(module=stage_module, stage=stage, local_rank=local, first_layout=layouts[ids[0]],
                         last_layout=layouts[ids[-1]], data_parallel=dp, units=units, schedule=schedule,
                         notes=notes, groups=groups)


def make_loss_fn(global_batch: int):
    """Sum of this rank's per-sample losses over the global batch: gradients sum exactly."""
    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return per_sample_loss(output, target).sum() / global_batch
    return loss_fn


def _add_relayout(stage_module: StageModule, src: Layout, dst: Layout, smesh, key: str) -> None:
    if needs_relayout(src, dst):
        stage_module.relayouts[key] = Relayout(src, dst, smesh["stage"].get_group())
        stage_module.order.append(("relayouts", key))


def _tie(stage_module: StageModule, model: ModelSpec, plan: Plan, seed: int, local: int, first: Layout,
         last: Layout, groups: GroupCache, smesh) -> tuple[nn.Parameter, object] | None:
    """Tied token weight (Megatron's way): one parameter when embedding and head share a stage,
    else an identical copy on the first and the last stage. Each TP group adds its gradient
    once (the copies on its other ranks are duplicates), and one SUM over the ranks of both
    ends gives every holder the whole gradient, so the copies stay equal. Returns the
    parameter and that group (None on stages that hold neither end)."""
    if not is_tied(model):
        return None
    ends = sorted({0, plan.pp - 1})
    per_stage = smesh.size() // plan.pp
    ranks = tuple(s * per_stage + j for s in ends for j in range(per_stage))
    group = groups.group([ranks])  # collective: every rank creates it
    embed, head = stage_module.embed, stage_module.head
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


def _apply_data_parallel(stage_module: StageModule, plan: Plan, ids: list[int], meshes: dict, bf16: bool,
                         tied: tuple[nn.Parameter, object] | None, experts: dict[int, ExpertShard]
                         ) -> tuple[DataParallel, list[Unit]]:
    """A flat bucket (DDP, ZeRO-1/2) or FSDP (ZeRO-3) for each block, the embedding (like the
    first layer) and the head (like the last); the tied weight and each MoE layer's experts
    (over their expert-data-parallel group) get their own bucket."""
    dp = DataParallel(micro_batches=plan.micro_batches)
    dtype = torch.bfloat16 if bf16 else torch.float32
    parts: list[tuple[str, nn.Module, int]] = [(f"layer {i}", stage_module.layers[str(i)], i) for i in ids]
    if stage_module.embed is not None:
        parts.insert(0, ("embedding", stage_module.embed, ids[0]))
    if stage_module.head is not None:
        parts.append(("head", stage_module.head, ids[-1]))
    skip = frozenset([tied[0]] if tied else []) | frozenset(p for e in experts.values() for p in e.params)
    units = []
    for name, module, i in parts:
        strategy = plan.layers[i]
        dp_mesh = meshes[Layout.of(strategy)]["dp"]
        params = [p for p in module.parameters() if p not in skip]
        if not params:
            continue
        dp_type = strategy.dp_type if strategy.dp > 1 else DPType.DDP
        unit = Unit(name=name, dp_type=dp_type, dp=strategy.dp, numel=sum(local(p).numel() for p in params))
        if dp_type == DPType.ZERO3:
            ignored = skip & set(module.parameters())
            apply_fsdp(module, dp_mesh, dp, bf16, set(ignored))
            unit.module, unit.ignored = module, frozenset(ignored)
        else:
            unit.bucket = dp.add_bucket(params, dp_mesh.get_group(), dp_type, dtype)
        units.append(unit)
    for i, e in experts.items():
        units.append(Unit(name=f"layer {i} experts", dp_type=e.dp_type, dp=e.dp, numel=e.numel,
                          bucket=dp.add_bucket(e.params, e.group, e.dp_type, dtype)))
    if tied:
        weight, group = tied
        units.append(Unit(name="tied embedding", dp_type=DPType.DDP, dp=1, numel=weight.numel(),
                          # its group's ranks reach the tied weight's last use at different
                          # points of backward (TP duplicates add nothing): reduce after it
                          bucket=dp.add_bucket([weight], group, DPType.DDP, dtype, eager=False)))
    return dp, units
