"""ModelSpec: what is trained: an embedding, a list of (possibly different) layers, a head."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specs.errors import SpecError, one_of, positive_int, require
from specs.hashing import cached_hash, without_cached_hash
from specs.layer_parts import MLASpec, MoESpec
from specs.limits import MAX_LAYERS, at_most, check_int_fields

LAYER_KINDS = ("gpt", "llama", "bert", "t5_encoder", "t5_decoder", "vit", "swin", "moe")
"""gpt: pre-norm decoder (GPT-2/Megatron); llama: RMSNorm, gated SiLU FFN, no biases (also
Mistral, Qwen, Gemma, Phi-3, DeepSeek dense blocks); bert: post-norm encoder;
t5_encoder/t5_decoder: T5 blocks (decoder has cross-attention); vit: pre-norm encoder over
patches; swin: windowed-attention block; moe: a llama-style decoder block whose MLP is a
mixture of experts (LayerSpec.moe)."""

DROPOUT_FREE_KINDS = ("llama", "moe")
"""Kinds trained without dropout (no one-byte masks kept)."""
CAUSAL_KINDS = ("gpt", "llama", "t5_decoder", "moe")
"""Kinds whose self-attention is masked causally (decoders); the rest use a padding mask."""

NORMS = ("layernorm", "rmsnorm")
ATTENTION_KINDS = ("eager", "flash")
"""eager: scores, softmax and dropout as separate kernels that keep the s x s probabilities for
backward (Megatron 2021, what the vTrain runs measured); flash: one fused kernel that keeps only
the output and a per-row log-sum-exp and recomputes the scores in backward (FlashAttention-2/3,
PyTorch SDPA)."""


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """One Transformer block: everything its parameter, FLOP and activation counts need."""

    kind: str
    """One of LAYER_KINDS."""
    hidden_size: int
    """Model width h."""
    num_heads: int
    """Attention (query) heads a; tensor parallel degrees must divide it."""
    num_kv_heads: int = 0
    """Key/value heads for grouped-query attention; 0 means num_heads."""
    head_dim: int = 0
    """Width of one head; 0 means hidden_size // num_heads (T5 sets d_kv)."""
    ffn_hidden_size: int
    """Inner width of the MLP (4h for GPT, 11008 for LLaMA-2 7B)."""
    gated_ffn: bool = False
    """Gated MLP (SwiGLU/GeGLU): three weight matrices instead of two."""
    seq_len: int
    """Tokens (or patches) per sample that this layer sees."""
    attention_window: int = 0
    """Tokens each token attends to; 0 means all seq_len (Swin: window_size**2)."""
    cross_attention_seq_len: int = 0
    """Length of the encoder output attended to (T5 decoder); 0 = no cross-attention."""
    bias: bool = True
    """Linear layers have biases (GPT/BERT/ViT/Swin yes; LLaMA/T5 no)."""
    norm: str = "layernorm"
    """layernorm (weight and bias) or rmsnorm (weight only)."""
    relative_position_params: int = 0
    """Extra learned position parameters held by the block (T5 bias, Swin table)."""
    downsample_to: int = 0
    """Swin patch merging after this block: output width (0 = none)."""
    sliding_window: int = 0
    """Causal sliding-window attention (Mistral, Gemma-2's local layers): each query attends
    to at most this many keys; 0 = none. Attention FLOPs and scores scale with it."""
    qkv_bias: bool | None = None
    """Q/K/V projections have biases; None follows ``bias`` (Qwen2: true with bias false)."""
    out_bias: bool | None = None
    """The attention output projection has a bias; None follows ``bias``."""
    mlp_bias: bool | None = None
    """MLP (and expert) linear layers have biases; None follows ``bias``."""
    qk_norm: bool = False
    """Qwen3: an RMSNorm over head_dim on queries and on keys."""
    sandwich_norm: bool = False
    """Gemma-2: norms after attention and after the MLP too (four per block)."""
    stack_norm: bool = False
    """A norm closes the stack this block ends (T5's encoder; the decoder's is the head's)."""
    moe: MoESpec | None = None
    """The mixture-of-experts MLP of a 'moe' block (ffn_hidden_size is then the expert width)."""
    mla: MLASpec | None = None
    """DeepSeek multi-head latent attention instead of q/k/v projections (head_dim is then
    the query/key head width; num_kv_heads equals num_heads)."""
    attention: str = "eager"
    """How attention is computed, one of ATTENTION_KINDS (time and activation memory differ)."""

    __hash__ = cached_hash  # a cache key of the cost models and planners
    __getstate__ = without_cached_hash

    def __post_init__(self) -> None:
        one_of(self.kind, LAYER_KINDS, "kind")
        one_of(self.norm, NORMS, "norm")
        require((self.kind == "moe") == (self.moe is not None), "moe",
                f"a layer has experts exactly when its kind is 'moe' (kind {self.kind!r}, "
                f"moe {'set' if self.moe else 'unset'})")
        if self.sliding_window < 0:
            raise SpecError("sliding_window", f"must be >= 0, got {self.sliding_window}")
        one_of(self.attention, ATTENTION_KINDS, "attention")
        for name in ("hidden_size", "num_heads", "ffn_hidden_size", "seq_len"):
            positive_int(getattr(self, name), name)
        kv = self.kv_heads
        require(self.num_heads % kv == 0, "num_kv_heads",
                f"num_heads({self.num_heads}) is not a multiple of num_kv_heads({kv})")
        check_int_fields(self)
        if self.head_dim == 0:
            require(self.hidden_size % self.num_heads == 0, "num_heads",
                    f"hidden_size({self.hidden_size}) is not divisible by num_heads({self.num_heads})")

    # -- derived shapes -------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def attention_span(self) -> int:
        """Keys each query attends to: the window (Swin) or sliding window, at most seq_len."""
        spans = [w for w in (self.attention_window, self.sliding_window) if w]
        return min([self.seq_len, *spans])

    @property
    def has_dropout(self) -> bool:
        return self.kind not in DROPOUT_FREE_KINDS

    @property
    def causal(self) -> bool:
        """Self-attention masked causally (a decoder block)."""
        return self.kind in CAUSAL_KINDS

    def _flag(self, value: bool | None) -> bool:
        return self.bias if value is None else value

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_size

    # -- counts -----------------------------------------------------------------------
    def _attention_params(self) -> int:
        h, q, kv = self.hidden_size, self.q_width, self.kv_width
        if self.mla is not None:
            return self.mla.params(h, self.num_heads, self._flag(self.qkv_bias))
        weights = h * q + 2 * h * kv + q * h
        biases = ((q + 2 * kv) if self._flag(self.qkv_bias) else 0) + (h if self._flag(self.out_bias) else 0)
        return weights + biases + (2 * self.head_size if self.qk_norm else 0)

    def _mlp_params(self, width: int) -> int:
        """One dense MLP of inner width ``width``."""
        h, mats = self.hidden_size, 3 if self.gated_ffn else 2
        biases = ((2 * width if self.gated_ffn else width) + h) if self._flag(self.mlp_bias) else 0
        return mats * h * width + biases

    def _ffn_params(self) -> int:
        if self.moe is not None:
            return self.moe.params(self.hidden_size, self._mlp_params)
        return self._mlp_params(self.ffn_hidden_size)

    def active_param_count(self) -> int:
        """Parameters one token passes through (param_count for a dense block)."""
        if self.moe is None:
            return self.param_count()
        return self.param_count() - self._ffn_params() + self.moe.active_params(self.hidden_size, self._mlp_params)

    def _norm_params(self, width: int) -> int:
        return 2 * width if self.norm == "layernorm" else width

    def param_count(self) -> int:
        """Parameters of the block (attention, cross-attention, MLP, norms, merging); counted
        once per spec (the tables ask for it thousands of times)."""
        cached = self.__dict__.get("_param_count")
        if cached is None:
            cached = self._count_params()
            object.__setattr__(self, "_param_count", cached)
        return cached

    def _count_params(self) -> int:
        n_attn = 2 if self.cross_attention_seq_len else 1
        total = n_attn * self._attention_params() + self._ffn_params()
        norms = n_attn + 1 + (2 if self.sandwich_norm else 0) + (1 if self.stack_norm else 0)
        total += norms * self._norm_params(self.hidden_size)
        total += self.relative_position_params
        if self.downsample_to:
            total += self._norm_params(4 * self.hidden_size) + 4 * self.hidden_size * self.downsample_to
        return total

    def forward_flops(self, batch: int) -> float:
        """Matmul FLOPs of one forward pass over ``batch`` samples (2 per multiply-add)."""
        h, s = self.hidden_size, self.seq_len
        mats = 3 if self.gated_ffn else 2
        if self.mla is not None:
            attention = self.mla.flops_per_token(h, self.num_heads, self.attention_span)
        else:
            proj = 2 * (2 * h * self.q_width + 2 * h * self.kv_width)
            attention = proj + 2 * 2 * self.attention_span * self.q_width
        if self.moe is not None:  # active experts only
            ffn = self.moe.flops_per_token(h, mats)
        else:
            ffn = 2 * h * self.ffn_hidden_size * mats
        per_token = attention + ffn
        if self.cross_attention_seq_len:
            # queries from this layer (and output proj) per token; keys/values once per encoder token
            per_token += 2 * 2 * h * self.q_width + 2 * 2 * self.cross_attention_seq_len * self.q_width
            per_token += 2 * 2 * h * self.kv_width * self.cross_attention_seq_len / s
        flops = per_token * s
        if self.downsample_to:
            flops += 2 * (s // 4) * 4 * h * self.downsample_to
        return float(flops * batch)

    def output_elements(self, batch: int) -> int:
        """Elements of the activation this block hands to the next one."""
        if self.downsample_to:
            return batch * (self.seq_len // 4) * self.downsample_to
        return batch * self.seq_len * self.hidden_size


@dataclass(frozen=True, kw_only=True)
class EmbeddingSpec:
    """Token or patch embedding (with learned positions where the family has them)."""

    kind: str = "token"
    """token (vocabulary lookup) or patch (conv over image patches)."""
    hidden_size: int
    vocab_size: int = 0
    """Token vocabulary; 0 for patch embeddings."""
    max_positions: int = 0
    """Learned absolute position embeddings; 0 for rotary/relative positions."""
    type_vocab_size: int = 0
    """BERT token-type embeddings."""
    norm: str = ""
    """Norm right after the embedding ('' none, 'layernorm')."""
    patch_size: int = 0
    in_channels: int = 3
    cls_token: bool = False

    def __post_init__(self) -> None:
        one_of(self.kind, ("token", "patch"), "embedding.kind")
        positive_int(self.hidden_size, "embedding.hidden_size")
        if self.kind == "token":
            positive_int(self.vocab_size, "vocab_size")
        else:
            positive_int(self.patch_size, "patch_size")
        check_int_fields(self, "embedding.")

    def param_count(self) -> int:
        h = self.hidden_size
        if self.kind == "token":
            total = (self.vocab_size + self.type_vocab_size) * h
        else:
            total = self.in_channels * self.patch_size**2 * h + h + (h if self.cls_token else 0)
        total += self.max_positions * h
        return total + (2 * h if self.norm == "layernorm" else 0)


@dataclass(frozen=True, kw_only=True)
class HeadSpec:
    """What follows the last block: final norm, pooler, LM or classification head."""

    kind: str = "lm"
    """lm (next-token/MLM logits over the vocabulary), classifier, or none."""
    hidden_size: int
    output_size: int
    """Vocabulary (lm) or classes (classifier)."""
    tied: bool = False
    """LM weights shared with the token embedding (not counted twice)."""
    final_norm: str = ""
    """'' / layernorm / rmsnorm applied before the head."""
    pooler: bool = False
    """BERT pooler: dense h x h + tanh on the first token."""
    transform: bool = False
    """BERT MLM transform: dense h x h, GELU, layernorm, plus an output bias."""
    next_sentence: bool = False
    """BERT pre-training's next-sentence classifier on the pooled output (h -> 2, with bias)."""
    seq_len: int = 1
    """Positions the head is applied to (seq for lm, 1 for classifier)."""

    def __post_init__(self) -> None:
        one_of(self.kind, ("lm", "classifier", "none"), "head.kind")
        positive_int(self.hidden_size, "head.hidden_size")
        check_int_fields(self, "head.")

    @property
    def tied_lm(self) -> bool:
        """An LM head whose weight is the token embedding's matrix."""
        return self.tied and self.kind == "lm"

    def param_count(self) -> int:
        h = self.hidden_size
        total = {"": 0, "layernorm": 2 * h, "rmsnorm": h}[self.final_norm]
        total += (h * h + h) if self.pooler else 0
        total += 2 * h + 2 if self.next_sentence else 0
        if self.transform:
            total += h * h + h + 2 * h + self.output_size
        if self.kind != "none" and not self.tied:
            total += h * self.output_size + (self.output_size if self.kind == "classifier" else 0)
        return total

    def forward_flops(self, batch: int) -> float:
        if self.kind == "none":
            return 0.0
        return float(2 * batch * self.seq_len * self.hidden_size * self.output_size)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model: its embedding, its layers in order, its head."""

    name: str
    embedding: EmbeddingSpec
    layers: tuple[LayerSpec, ...]
    head: HeadSpec
    family: str = ""
    """The config's model_type (bert, t5, gpt2, llama, mixtral, deepseek_v3, ...): where it came from."""

    def __post_init__(self) -> None:
        require(len(self.layers) > 0, "layers", "a model needs at least one layer")
        at_most(len(self.layers), MAX_LAYERS, "layers", "planners keep per-layer tables")
        object.__setattr__(self, "layers", tuple(self.layers))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def seq_len(self) -> int:
        return self.layers[0].seq_len

    def param_count(self) -> int:
        return (self.embedding.param_count() + sum(l.param_count() for l in self.layers)
                + self.head.param_count())

    def active_param_count(self) -> int:
        """Parameters a token passes through (MoE: router, top-k and shared experts only)."""
        return (self.embedding.param_count() + sum(l.active_param_count() for l in self.layers)
                + self.head.param_count())

    def forward_flops(self, batch: int) -> float:
        return sum(l.forward_flops(batch) for l in self.layers) + self.head.forward_flops(batch)

    def layer_types(self) -> list[LayerSpec]:
        """The distinct layers, in order of first appearance."""
        return list(dict.fromkeys(self.layers))

    def with_seq_len(self, seq_len: int) -> "ModelSpec":
        """The same model trained at another sequence length (token models only)."""
        positive_int(seq_len, "seq_len")
        layers = tuple(dataclasses.replace(l, seq_len=seq_len,
                                           cross_attention_seq_len=seq_len if l.cross_attention_seq_len else 0)
                       for l in self.layers)
        head = dataclasses.replace(self.head, seq_len=seq_len if self.head.seq_len > 1 else 1)
        return dataclasses.replace(self, layers=layers, head=head)

    def with_attention(self, attention: str) -> "ModelSpec":
        """The same model with every layer's attention computed as ``attention`` (eager/flash)."""
        one_of(attention, ATTENTION_KINDS, "attention")
        return dataclasses.replace(self, layers=tuple(dataclasses.replace(l, attention=attention)
                                                      for l in self.layers))

    def scaled(self, *, hidden_size: int | None = None, num_layers: int | None = None,
               seq_len: int | None = None, name: str | None = None) -> "ModelSpec":
        """A smaller copy (same family and layer kinds) for CPU runs of big zoo models.

        ``hidden_size`` is the new width of the first layer; every width scales by the same
        ratio. ``num_layers`` is shared out over the runs of equal-shape layers (T5's encoder
        and decoder, Swin's stages), each keeping at least one, and its last, layer.
        """
        layers = list(self.layers) if num_layers is None else _fewer_layers(self.layers, num_layers)
        emb, head = self.embedding, self.head
        if hidden_size is not None:
            ratio = positive_int(hidden_size, "hidden_size") / layers[0].hidden_size
            layers = [_rescale_layer(l, ratio) for l in layers]
            emb = dataclasses.replace(emb, hidden_size=layers[0].hidden_size)
            last = layers[-1]
            head = dataclasses.replace(head, hidden_size=last.downsample_to or last.hidden_size)
        model = dataclasses.replace(self, layers=tuple(layers), embedding=emb, head=head,
                                    name=name or f"{self.name}-scaled")
        return model.with_seq_len(seq_len) if seq_len is not None else model


def _fewer_layers(layers: tuple[LayerSpec, ...], num_layers: int) -> list[LayerSpec]:
    """``num_layers`` layers (fewer or more) that keep every run of same-shape layers (kind,
    width, tokens) and the end of each run (where Swin merges patches)."""
    positive_int(num_layers, "num_layers")
    runs: list[list[LayerSpec]] = []
    for layer in layers:
        key = (layer.kind, layer.hidden_size, layer.seq_len)
        if runs and (runs[-1][0].kind, runs[-1][0].hidden_size, runs[-1][0].seq_len) == key:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    if num_layers < len(runs):
        raise SpecError("num_layers", f"{num_layers} is fewer than the model's {len(runs)} runs of "
                        "different layers (each keeps at least one)")
    counts = [1] * len(runs)
    for _ in range(num_layers - len(runs)):  # give each next layer to the most under-served run
        i = max(range(len(runs)), key=lambda r: (len(runs[r]) / counts[r], -r))
        counts[i] += 1
    return [layer for run, n in zip(runs, counts) for layer in _spread(run, n)]


def _spread(run: list[LayerSpec], n: int) -> list[LayerSpec]:
    """``n`` layers of a run, evenly spaced, always ending with the run's last layer."""
    body = run[:-1] or run
    return [body[i * len(body) // (n - 1)] for i in range(n - 1)] + [run[-1]] if n > 1 else [run[-1]]


def _rescale_layer(layer: LayerSpec, ratio: float) -> LayerSpec:
    hidden = max(1, round(layer.hidden_size * ratio))
    heads = layer.num_heads
    while heads > 1 and hidden % heads:
        heads //= 2
    kv = layer.kv_heads if heads % layer.kv_heads == 0 else heads
    def width(n: int) -> int:
        return max(1, round(n * ratio)) if n else 0  # 0 (= unset) stays 0
    moe = layer.moe and dataclasses.replace(
        layer.moe, expert_ffn_hidden_size=width(layer.moe.expert_ffn_hidden_size),
        shared_expert_ffn_hidden_size=width(layer.moe.shared_expert_ffn_hidden_size))
    mla = layer.mla and dataclasses.replace(
        layer.mla, q_lora_rank=width(layer.mla.q_lora_rank), kv_lora_rank=width(layer.mla.kv_lora_rank))
    return dataclasses.replace(
        layer, hidden_size=hidden, num_heads=heads, num_kv_heads=kv if layer.num_kv_heads else 0,
        head_dim=layer.head_dim if layer.mla else 0, ffn_hidden_size=width(layer.ffn_hidden_size),
        downsample_to=round(layer.downsample_to * ratio), relative_position_params=0, moe=moe, mla=mla)
