"""Vocabulary parallelism of the embedding and the LM head (Megatron): the padded vocabulary's
rows split over the vocab_tp group, a vocab-parallel cross-entropy (max, sum of exponentials
and target logit all-reduced: no rank holds the full logits), the sequence split around them
(vocab_sp megatron: reduce-scatter/all-gather; ulysses: tokens split, weights replicated) and
ZeRO-3 of their parameters (vocab_zero3).

Embedding and head run in the vocabulary layout: ``vocab_tp`` consecutive ranks per group and
the stage's other ranks as data-parallel replicas; relayouts connect it to the first and last
layers. Padded rows start at zero, never win (their logits are -inf) and carry no loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from executor.model import Embedding, Head
from executor.parallel.layout import Layout
from executor.parallel.sequence import GatherSeq, GatherSeqReduceGrad, ReduceScatterSeq, ScatterSeq
from specs import ModelSpec, Plan, SequenceParallel, SpecError


@dataclass(frozen=True, kw_only=True)
class VocabSplit:
    """How this run splits the embedding and head (from the Plan's vocab_* fields)."""

    tp: int
    """vocab_tp: ranks of a vocabulary group."""
    sp: SequenceParallel
    """vocab_sp: none, megatron (sequence split around the vocab-parallel matmuls) or ulysses
    (the group splits the tokens; weights replicated)."""
    zero3: bool
    """Parameters FSDP-sharded over their data-parallel replicas."""
    layout: Layout
    """Where embedding and head run on a stage: tp = vocab_tp, dp = the other ranks."""
    vocab: int
    """Real vocabulary (rows of the reference model)."""
    rows: int
    """Padded vocabulary (Plan.padded_vocab_size)."""

    @property
    def sharded(self) -> bool:
        """Rows split over the group (else replicated: vocab_tp 1 or Ulysses)."""
        return self.tp > 1 and self.sp != SequenceParallel.ULYSSES

    @property
    def local_rows(self) -> int:
        return self.rows // self.tp if self.sharded else self.rows

    def owns_loss(self, local: int) -> bool:
        """The rank's loss counts once: one copy per vocabulary group, or every Ulysses share."""
        return self.sp == SequenceParallel.ULYSSES or self.layout.tp_index(local) == 0

    def padded_names(self) -> dict[str, int]:
        """Parameters padded to ``rows`` rows and the reference's rows of each."""
        return {name: self.vocab for name in ("embed.tokens.weight", "head.out.weight", "head.out.bias")}

    @property
    def weights_see_chunks(self) -> bool:
        """Replicated parameters fed a sequence chunk: their gradients are partial over the group."""
        return self.sp != SequenceParallel.NONE


def vocab_split(plan: Plan, model: ModelSpec, per_stage: int) -> VocabSplit | None:
    """The split the plan asks for on stages of ``per_stage`` ranks, or None
    (Plan.vocab_relaid_out)."""
    if not plan.vocab_relaid_out(model, per_stage):
        return None
    vocab = model.embedding.vocab_size if model.embedding.kind == "token" else model.head.output_size
    return VocabSplit(tp=plan.vocab_tp, sp=plan.vocab_sp, zero3=plan.vocab_zero3,
                      layout=Layout(tp=plan.vocab_tp, dp=per_stage // plan.vocab_tp), vocab=vocab,
                      rows=plan.padded_vocab_size(vocab))


# -- autograd pieces --------------------------------------------------------------------------
class _SumFromGroup(torch.autograd.Function):
    """Partial sums -> their sum on every rank; the gradient of a replicated activation is whole
    on every rank already (Megatron's reduce_from_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


class _CopyToGroup(torch.autograd.Function):
    """Identity; backward sums the partial input gradients of a column-parallel matmul."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits split by columns over ``group`` (``first``: this rank's
    first column); columns at or past ``vocab`` are padding."""

    @staticmethod
    def forward(ctx, logits, targets, first: int, vocab: int, group):  # type: ignore[override]
        n = logits.shape[-1]
        columns = first + torch.arange(n, device=logits.device)
        z = logits.float().masked_fill(columns >= vocab, float("-inf"))
        top = z.max(dim=-1).values
        _all_reduce(top, group, dist.ReduceOp.MAX)
        e = (z - top.unsqueeze(-1)).exp()
        total = e.sum(dim=-1)
        _all_reduce(total, group)
        mine = (targets >= first) & (targets < first + n)
        index = (targets - first).clamp(0, n - 1).unsqueeze(-1)
        # where, not a product: a padded column's -inf times 0 would be nan
        target_logit = torch.where(mine, z.gather(-1, index).squeeze(-1) - top, 0.0)
        _all_reduce(target_logit, group)
        ctx.save_for_backward(e / total.unsqueeze(-1), index, mine)
        ctx.dtype = logits.dtype
        return total.log() - target_logit

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        softmax, index, mine = ctx.saved_tensors
        g = softmax.scatter_add(-1, index, -mine.unsqueeze(-1).to(softmax.dtype))
        return (g * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None, None


def _all_reduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> None:
    if group is not None:
        dist.all_reduce(t, op=op, group=group)


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if isinstance(w, DTensor) else w


def _shard_rows(full: torch.Tensor, split: VocabSplit, mesh) -> nn.Parameter:
    """``full`` (reference rows) padded with zero rows to split.rows and cut into this rank's
    rows: a Shard(0) DTensor over the vocabulary group, or the whole padded tensor."""
    pad = full.new_zeros((split.rows - full.shape[0], *full.shape[1:]))
    padded = torch.cat([full.detach(), pad])
    if not split.sharded:
        return nn.Parameter(padded)
    rank = mesh.get_local_rank()
    shard = padded[rank * split.local_rows:(rank + 1) * split.local_rows].clone()
    return nn.Parameter(DTensor.from_local(shard, mesh, [Shard(0)], run_check=False))


# -- modules ----------------------------------------------------------------------------------
class VocabRows(nn.Module):
    """This rank's rows of the token embedding (lookup) or of the LM head (logits)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, first: int) -> None:
        super().__init__()
        self.weight, self.bias, self.first = weight, bias, first

    def forward(self, x: torch.Tensor, lookup: bool) -> torch.Tensor:
        w = _local(self.weight)
        if not lookup:
            return F.linear(x, w, _local(self.bias) if self.bias is not None else None)
        outside = (x < self.first) | (x >= self.first + w.shape[0])
        out = F.embedding((x - self.first).masked_fill(outside, 0), w)
        return out.masked_fill(outside.unsqueeze(-1), 0)


class VocabEmbedding(nn.Module):
    """Token embedding with its rows split (or its tokens split, Ulysses), then positions,
    token types and norm; hands the next layer the whole sequence, replicated on the group."""

    def __init__(self, emb: Embedding, split: VocabSplit, mesh) -> None:
        super().__init__()
        self.split, self.group = split, mesh.get_group() if split.tp > 1 else None
        first = mesh.get_local_rank() * split.local_rows if split.sharded else 0
        self.tokens = VocabRows(_shard_rows(emb.tokens.weight, split, mesh), None, first)
        self.types, self.positions, self.norm = emb.types, emb.positions, emb.norm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        split, group, offset = self.split, self.group, 0
        if split.sp == SequenceParallel.ULYSSES:
            offset = dist.get_rank(group) * (ids.shape[1] // split.tp)
            ids = ids.chunk(split.tp, dim=1)[dist.get_rank(group)]
        x = self.tokens(ids, lookup=True)
        if split.sharded and split.sp == SequenceParallel.MEGATRON:
            offset = dist.get_rank(group) * (ids.shape[1] // split.tp)
            x = ReduceScatterSeq.apply(x, group, 1)
        elif split.sharded:
            x = _SumFromGroup.apply(x, group)
        if self.types is not None:
            x = x + self.types.weight[0]
        if self.positions is not None:
            x = x + self.positions.weight[offset:offset + x.shape[1]]
        if self.norm is not None:
            x = self.norm(x)
        return GatherSeq.apply(x, group, 1) if split.weights_see_chunks else x


class VocabHead(nn.Module):
    """Final norm / transform, then this rank's logits: its vocabulary columns (sharded) or its
    tokens' full-vocabulary logits (Ulysses). The loss is ``VocabHead.per_sample_loss`` (``VocabLoss``)."""

    def __init__(self, head: Head, split: VocabSplit, mesh) -> None:
        super().__init__()
        self.split, self.group = split, mesh.get_group() if split.tp > 1 else None
        self.first = mesh.get_local_rank() * split.local_rows if split.sharded else 0
        self.final_norm, self.transform = head.final_norm, head.transform
        bias = _shard_rows(head.out.bias, split, mesh) if head.out.bias is not None else None
        self.out = VocabRows(_shard_rows(head.out.weight, split, mesh), bias, self.first)
        self.loss = VocabLoss(split, self.group, self.first)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        split, group = self.split, self.group
        if split.weights_see_chunks:
            x = ScatterSeq.apply(x, group, 1)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.transform is not None:
            x = self.transform(x)
        if split.sharded and split.sp == SequenceParallel.MEGATRON:
            x = GatherSeqReduceGrad.apply(x, group, 1)
        elif split.sharded:
            x = _CopyToGroup.apply(x, group)
        return self.out(x, lookup=False)

    def per_sample_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Token-mean cross-entropy of each sample (``VocabLoss``)."""
        return self.loss(logits, targets)


class VocabLoss(nn.Module):
    """Token-mean cross-entropy of each sample, as executor.model.per_sample_loss, of logits
    split by vocabulary columns (its all-reduces run here: a module, so that the collective
    trace can tell them from the head's); under Ulysses each rank returns its tokens' share
    (the shares sum to the loss)."""

    def __init__(self, split: VocabSplit, group, first: int) -> None:
        super().__init__()
        self.split, self.group, self.first = split, group, first

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seq = targets.shape[1]
        if self.split.sp == SequenceParallel.ULYSSES:
            targets = targets.chunk(self.split.tp, dim=1)[dist.get_rank(self.group)]
        if self.split.sharded:
            ce = _VocabParallelCrossEntropy.apply(logits, targets, self.first, self.split.vocab, self.group)
        else:  # every column on this rank: torch's fused cross-entropy (the unfused one above made four
            # more passes over the logits, twice the time of the loss; docs/executor.md), padding cut off
            ce = F.cross_entropy(logits[..., :self.split.vocab].float().flatten(0, 1), targets.flatten(),
                                 reduction="none").view(targets.shape)
        return ce.sum(dim=1) / seq


def refuse_vocab(plan: Plan, model: ModelSpec, tied: bool) -> None:
    """What the vocabulary split cannot run here, in one line (SpecError)."""
    if not plan.vocab_asks_split:
        return
    if model.embedding.kind != "token" or model.head.kind != "lm":
        raise SpecError("vocab_tp", f"vocabulary parallelism needs a token embedding and an lm head, got "
                        f"{model.embedding.kind} embedding and {model.head.kind} head")
    if model.embedding.vocab_size != model.head.output_size:
        raise SpecError("vocab_tp", f"vocabulary parallelism needs the embedding's vocabulary "
                        f"({model.embedding.vocab_size}) to be the head's ({model.head.output_size})")
    if plan.vocab_zero3 and tied:
        raise SpecError("vocab_zero3", "vocab_zero3 with tied embeddings is not run: the tied matrix is kept "
                        "replicated on its holders (untie the head or drop vocab_zero3)")


# -- what parallelize asks of the split -------------------------------------------------------
def tie_vocab(embed: VocabEmbedding | None, head: VocabHead | None, split: VocabSplit, ends: list[int],
              per_stage: int, groups, fresh_embedding) -> tuple[nn.Parameter, object] | None:
    """Tied rows under the split: one parameter when embedding and head share a stage, else a
    copy of the same rows on the head's ranks; their gradient is summed over the ranks of both
    ends that hold the same rows (no duplicates here: each rank adds its own tokens' part).
    ``fresh_embedding()`` builds the reference embedding (the copy's initial rows)."""
    if split.sharded:
        sets = [tuple(s * per_stage + j for s in ends for j in range(per_stage) if split.layout.tp_index(j) == r)
                for r in range(split.tp)]
    else:
        sets = [tuple(s * per_stage + j for s in ends for j in range(per_stage))]
    group = groups.group(sets)  # collective: every rank creates them
    if embed is None and head is None:
        return None
    if head is not None and embed is not None:
        head.out.weight = embed.tokens.weight
    elif head is not None:
        full = fresh_embedding().tokens.weight.detach()
        padded = torch.cat([full, full.new_zeros(split.rows - full.shape[0], full.shape[1])])
        with torch.no_grad():
            _local(head.out.weight).copy_(padded[head.first:head.first + split.local_rows])
    return (embed.tokens.weight if embed is not None else head.out.weight), group


def vocab_dp_parts(name: str, module: VocabEmbedding | VocabHead, split: VocabSplit, meshes: dict, smesh,
                   neighbour_dp_type: str) -> list[tuple]:
    """Data-parallel units of the embedding or head: its vocabulary rows (summed over the
    replicas holding the same rows: the vocabulary layout's dp group, or the whole stage under
    Ulysses) and the rest (norms, positions: the whole stage when they see sequence chunks).
    ZeRO-3 under vocab_zero3, else like the neighbouring layer (as the cost model charges)."""
    stage = (smesh["stage"], split.layout.tp * split.layout.dp)
    replicas = (meshes[split.layout]["dp"], split.layout.dp)
    rows_group = stage if split.sp == SequenceParallel.ULYSSES else replicas
    rest_group = stage if split.weights_see_chunks else replicas
    dp_type = "zero3" if split.zero3 else neighbour_dp_type
    rows = module.tokens if isinstance(module, VocabEmbedding) else module.out
    return [(name, rows, *rows_group, dp_type, None), (f"{name} norms", module, *rest_group, dp_type, rows)]
