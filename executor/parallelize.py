"""parallelize(model, plan): the recipe that turns a ModelSpec and a Plan into this rank's
share of the model: build the stage, tensor parallel, checkpointing, relayouts, data
parallel, pipeline (torchtitan style, one apply_* step each)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from executor.model import build_block, build_embedding, build_head, per_sample_loss
from executor.parallel.checkpoint import apply_ac
from executor.parallel.data import GradientSync, apply_ddp, apply_fsdp, apply_fsdp_root
from executor.parallel.layout import Layout, stage_mesh
from executor.parallel.pipeline import apply_pp
from executor.parallel.relayout import Relayout, needs_relayout
from executor.parallel.tensor import apply_tp
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
class ParallelModel:
    """This rank's share of the model and what the training loop needs to drive it."""

    module: StageModule
    stage: int
    local_rank: int
    first_layout: Layout
    """Layout of the stage's first layer (which batch slice this rank feeds in)."""
    last_layout: Layout
    """Layout of the stage's last layer (which targets this rank scores)."""
    grad_sync: GradientSync
    schedule: object | None = None
    """Pipeline schedule (pp > 1) or None."""
    notes: list[str] = field(default_factory=list)


def build_meshes(plan: Plan, world_size: int, device: str) -> tuple[dict[Layout, object], object]:
    """Every layout's (pp, dp, tp) mesh and the (pp, stage) mesh, built in the same order on
    every rank (process groups are created collectively)."""
    layouts = sorted({Layout.of(s) for s in plan.layers}, key=lambda l: (l.tp, l.dp, l.consecutive))
    meshes = {layout: layout.mesh(plan.pp, device) for layout in layouts}
    return meshes, stage_mesh(plan.pp, world_size, device)


def parallelize(model: ModelSpec, plan: Plan, rank: int, world_size: int, *, seed: int = 0,
                device: str = "cpu") -> ParallelModel:
    """The recipe: stage -> tensor parallel -> checkpointing -> relayouts -> data parallel -> pipeline."""
    meshes, smesh = build_meshes(plan, world_size, device.split(":")[0])
    per_stage = world_size // plan.pp
    stage, local = divmod(rank, per_stage)
    ids = list(plan.stage_ranges()[stage])
    layouts = {i: Layout.of(plan.layers[i]) for i in ids}
    stage_module = StageModule()
    if stage == 0:
        stage_module.embed = build_embedding(model, seed)
        stage_module.order.append(("embed", ""))
    for pos, i in enumerate(ids):
        if pos > 0:
            _add_relayout(stage_module, layouts[ids[pos - 1]], layouts[i], smesh, f"{i}")
        block = build_block(model, i, seed)
        block = apply_tp(block, meshes[layouts[i]]["tp"], sequence_parallel=plan.layers[i].sp)
        block = apply_ac(block, plan.layers[i].checkpoint)
        stage_module.layers[str(i)] = block
        stage_module.order.append(("layers", str(i)))
    if stage == plan.pp - 1:
        stage_module.head = build_head(model, seed)
        stage_module.order.append(("head", ""))
    else:  # hand the next stage its input already in its first layer's layout
        _add_relayout(stage_module, layouts[ids[-1]], Layout.of(plan.layers[ids[-1] + 1]), smesh, "out")
    stage_module.to(device)
    sync = _apply_data_parallel(stage_module, plan, ids, meshes)
    schedule = None
    if plan.pp > 1:
        loss_fn = make_loss_fn(plan.global_batch)
        schedule = apply_pp(stage_module, stage, plan.pp, smesh["pp"].get_group(), torch.device(device),
                            plan.micro_batches, plan.schedule, loss_fn)
    notes = ["vocab_tp ignored: embedding and head are replicated on the TP group"] if plan.vocab_tp > 1 else []
    return ParallelModel(module=stage_module, stage=stage, local_rank=local, first_layout=layouts[ids[0]],
                         last_layout=layouts[ids[-1]], grad_sync=sync, schedule=schedule, notes=notes)


def make_loss_fn(global_batch: int):
    """Sum of this rank's per-sample losses over the global batch: gradients sum exactly."""
    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return per_sample_loss(output, target).sum() / global_batch
    return loss_fn


def _add_relayout(stage_module: StageModule, src: Layout, dst: Layout, smesh, key: str) -> None:
    if needs_relayout(src, dst):
        stage_module.relayouts[key] = Relayout(src, dst, smesh["stage"].get_group())
        stage_module.order.append(("relayouts", key))


def _apply_data_parallel(stage_module: StageModule, plan: Plan, ids: list[int], meshes: dict) -> GradientSync:
    """DDP or FSDP for each block, the embedding (like the first layer) and the head (like
    the last), then one FSDP root if any part is sharded."""
    sync = GradientSync(micro_batches=plan.micro_batches)
    parts: list[tuple[nn.Module, int]] = [(stage_module.layers[str(i)], i) for i in ids]
    if stage_module.embed is not None:
        parts.insert(0, (stage_module.embed, ids[0]))
    if stage_module.head is not None:
        parts.append((stage_module.head, ids[-1]))
    ddp_params: set[nn.Parameter] = set()
    root_mesh = None
    for module, i in parts:
        strategy = plan.layers[i]
        dp_mesh = meshes[Layout.of(strategy)]["dp"]
        if strategy.dp_type == DPType.DDP or strategy.dp == 1:
            apply_ddp(module, dp_mesh, sync)
            ddp_params.update(module.parameters())
        else:
            apply_fsdp(module, dp_mesh, strategy.dp_type)
            root_mesh = root_mesh or dp_mesh
    if root_mesh is not None:
        apply_fsdp_root(stage_module, root_mesh, ddp_params)
    return sync
