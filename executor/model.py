"""PyTorch modules built from a ModelSpec: embedding, one block per LayerSpec, head, and the loss.

Every block names its projections q/k/v/o (attention) and fc1/fc2 or gate/up/down (MLP) so
tensor parallelism can split them column- and row-wise. Each piece is initialised from its
own seed, so a pipeline stage builds only its layers and still matches a single-process run.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from executor.moe import MoE
from specs import EmbeddingSpec, HeadSpec, LayerSpec, ModelSpec

CAUSAL_KINDS = ("gpt", "llama", "t5_decoder", "moe")
PRE_NORM_KINDS = ("gpt", "llama", "t5_encoder", "t5_decoder", "vit", "swin", "moe")


def _norm(kind: str, width: int) -> nn.Module:
    return nn.LayerNorm(width) if kind == "layernorm" else nn.RMSNorm(width)


class Attention(nn.Module):
    """Multi-head (grouped-query) attention; heads per rank are read off the q/k widths, so
    the same code runs on a tensor-parallel shard."""

    def __init__(self, spec: LayerSpec, causal: bool) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_size
        self.head_dim, self.causal = d, causal
        self.window = spec.attention_window if spec.attention_window < spec.seq_len else 0
        self.q = nn.Linear(h, spec.q_width, bias=spec.bias)
        self.k = nn.Linear(h, spec.kv_width, bias=spec.bias)
        self.v = nn.Linear(h, spec.kv_width, bias=spec.bias)
        self.o = nn.Linear(spec.q_width, h, bias=spec.bias)
        self.around_core = None
        """None, or ``f(core, q, k, v, causal)`` run in place of the core (Ulysses' all-to-alls)."""

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        src = x if memory is None else memory
        b, s, _ = x.shape
        q = self.q(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
        k = self.k(src).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
        v = self.v(src).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
        if k.shape[1] != q.shape[1]:  # grouped-query: each kv head serves a group of q heads
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        causal = self.causal and memory is None
        if self.around_core is not None:
            out = self.around_core(self._core, q, k, v, causal)
        else:
            out = self._core(q, k, v, causal)
        return self.o(out.transpose(1, 2).flatten(2))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        """QK^T, softmax and attention over V (what Megatron's selective recomputation re-runs)."""
        s = q.shape[2]
        if self.window and s % self.window == 0:  # Swin: attention inside windows of tokens
            n = s // self.window
            q, k, v = (t.unflatten(2, (n, self.window)).transpose(1, 2) for t in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2, 3)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


class MLP(nn.Module):
    """fc1 -> GELU -> fc2, or the gated form gate/up -> SiLU * -> down."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        h, f, bias = spec.hidden_size, spec.ffn_hidden_size, spec.bias
        self.gated = spec.gated_ffn
        if self.gated:
            self.gate, self.up, self.down = nn.Linear(h, f, bias=bias), nn.Linear(h, f, bias=bias), nn.Linear(f, h, bias=bias)
        else:
            self.fc1, self.fc2 = nn.Linear(h, f, bias=bias), nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """One Transformer block of any LAYER_KINDS (pre- or post-norm, optional cross-attention
    and Swin patch merging)."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.pre_norm = spec.kind in PRE_NORM_KINDS
        self.norm1, self.norm2 = _norm(spec.norm, spec.hidden_size), _norm(spec.norm, spec.hidden_size)
        self.attn = Attention(spec, causal=spec.kind in CAUSAL_KINDS)
        self.cross = Attention(spec, causal=False) if spec.cross_attention_seq_len else None
        self.norm_cross = _norm(spec.norm, spec.hidden_size) if self.cross else None
        self.mlp = MoE(spec, lambda width: MLP(replace(spec, kind="llama", moe=None, ffn_hidden_size=width))) \
            if spec.moe is not None else MLP(spec)
        self.merge = None
        if spec.downsample_to:
            self.merge_norm = _norm(spec.norm, 4 * spec.hidden_size)
            self.merge = nn.Linear(4 * spec.hidden_size, spec.downsample_to, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.norm1(x))
            if self.cross is not None:  # no separate encoder stream here: attend over the block input
                x = x + self.cross(self.norm_cross(x), memory=x)
            x = x + self.mlp(self.norm2(x))
        else:
            x = self.norm1(x + self.attn(x))
            x = self.norm2(x + self.mlp(x))
        if self.merge is not None:  # patch merging: 4 neighbouring tokens -> one wider token
            x = self.merge(self.merge_norm(x.unflatten(1, (-1, 4)).flatten(2)))
        return x


class Embedding(nn.Module):
    """Token (+ learned positions, token types, norm) or patch embedding (+ cls token)."""

    def __init__(self, spec: EmbeddingSpec, seq_len: int) -> None:
        super().__init__()
        h = spec.hidden_size
        self.kind = spec.kind
        if spec.kind == "token":
            self.tokens = nn.Embedding(spec.vocab_size, h)
            nn.init.normal_(self.tokens.weight, std=0.02)  # GPT-2's scale: sane logits when tied
            self.types = nn.Embedding(spec.type_vocab_size, h) if spec.type_vocab_size else None
        else:
            self.patch = nn.Linear(spec.in_channels * spec.patch_size**2, h)
            self.cls = nn.Parameter(torch.randn(1, 1, h) * 0.02) if spec.cls_token else None
        self.positions = nn.Embedding(spec.max_positions, h) if spec.max_positions else None
        self.norm = nn.LayerNorm(h) if spec.norm == "layernorm" else None
        self.token_weight_grad = True
        """False: this copy adds nothing to the (tied) token weight's gradient (a TP duplicate)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.kind == "token":
            w = self.tokens.weight
            x = F.embedding(inputs, w if self.token_weight_grad else w.detach())
            if self.types is not None:
                x = x + self.types.weight[0]
        else:
            x = self.patch(inputs)
            if self.cls is not None:
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        if self.positions is not None:
            x = x + self.positions.weight[: x.shape[1]]
        return self.norm(x) if self.norm is not None else x


class Head(nn.Module):
    """Final norm, BERT transform/pooler, LM or classifier projection (``tied``: its weight is
    the token embedding's, set by whoever owns both, see Transformer and executor.parallelize)."""

    def __init__(self, spec: HeadSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.kind = spec.kind
        self.final_norm = _norm(spec.final_norm, h) if spec.final_norm else None
        self.transform = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.LayerNorm(h)) if spec.transform else None
        self.pooler = nn.Sequential(nn.Linear(h, h), nn.Tanh()) if spec.pooler and spec.kind == "classifier" else None
        self.out = nn.Linear(h, spec.output_size, bias=spec.kind == "classifier" or spec.transform) \
            if spec.kind != "none" else None
        self.out_weight_grad = True
        """False: this copy adds nothing to the output weight's gradient (a TP duplicate)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.kind == "classifier":
            x = self.pooler(x[:, 0]) if self.pooler is not None else x.mean(dim=1)
        elif self.transform is not None:
            x = self.transform(x)
        if self.out is None:
            return x
        w = self.out.weight
        return F.linear(x, w if self.out_weight_grad else w.detach(), self.out.bias)


def is_tied(model: ModelSpec) -> bool:
    """The head's output weight is the token embedding (same shape, spec says tied)."""
    return (model.head.tied_lm and model.embedding.kind == "token"
            and model.embedding.vocab_size == model.head.output_size
            and model.embedding.hidden_size == model.head.hidden_size)


def per_sample_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Loss of each sample: token-mean cross-entropy (lm), cross-entropy (classifier) or the
    mean square of the output (no head)."""
    if target.dtype != torch.long:
        return output.float().pow(2).flatten(1).mean(dim=1)
    if output.dim() == 3:
        ce = F.cross_entropy(output.float().flatten(0, 1), target.flatten(), reduction="none")
        return ce.view(target.shape).mean(dim=1)
    return F.cross_entropy(output.float(), target, reduction="none")


def build_embedding(model: ModelSpec, seed: int) -> Embedding:
    torch.manual_seed(seed * 1000 + 999)
    return Embedding(model.embedding, model.seq_len)


def build_block(model: ModelSpec, index: int, seed: int) -> Block:
    torch.manual_seed(seed * 1000 + index)
    return Block(model.layers[index])


def build_head(model: ModelSpec, seed: int) -> Head:
    torch.manual_seed(seed * 1000 + 998)
    return Head(model.head)


class Transformer(nn.Module):
    """The whole model on one process (the reference run and single-GPU profiling)."""

    def __init__(self, model: ModelSpec, seed: int = 0) -> None:
        super().__init__()
        self.embed = build_embedding(model, seed)
        self.layers = nn.ModuleList(build_block(model, i, seed) for i in range(model.num_layers))
        self.head = build_head(model, seed)
        if is_tied(model):
            self.head.out.weight = self.embed.tokens.weight

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def synthetic_batch(model: ModelSpec, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of ``batch`` samples, the same on every rank for a given seed."""
    g = torch.Generator().manual_seed(seed + 12345)
    emb, seq = model.embedding, model.seq_len
    if emb.kind == "token":
        inputs = torch.randint(0, emb.vocab_size, (batch, seq), generator=g)
    else:
        patches = seq - (1 if emb.cls_token else 0)
        inputs = torch.randn(batch, patches, emb.in_channels * emb.patch_size**2, generator=g)
    head = model.head
    if head.kind == "lm":
        targets = torch.randint(0, head.output_size, (batch, seq), generator=g)
    elif head.kind == "classifier":
        targets = torch.randint(0, head.output_size, (batch,), generator=g)
    else:
        targets = torch.zeros(batch)
    return inputs, targets
