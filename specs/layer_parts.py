"""Optional parts of a LayerSpec: a mixture-of-experts MLP (MoESpec) and DeepSeek's multi-head
latent attention (MLASpec), each with its own parameter and per-token FLOP counts.

Expert parallelism (LayerStrategy.ep, expert_tp, expert_dp_type) is per layer in the Plan.
"""
from __future__ import annotations

from dataclasses import dataclass

from specs.errors import SpecError, one_of, positive_int, positive_number, require
from specs.limits import check_int_fields

LEARNED = "learned"
"""MoESpec.routing: the model's own router, taken as routing each token uniformly over the experts it may
choose (the groups' limit, when set, first): what a router trained to balance gives on average."""
FAKE_BALANCED = "fake_balanced"
"""MoESpec.routing: NeMo AutoModel's FakeBalancedGate (``fake_balanced_gate: true`` in its benchmark recipes):
token t of a rank's micro-batch goes to experts (k t + j) mod E, j < k: k consecutive experts, every expert
the same load."""
ROUTINGS = (LEARNED, FAKE_BALANCED)


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """The MLP of a MoE block: a router, routed experts (top-k per token) and shared experts."""

    num_experts: int
    """Routed experts E."""
    top_k: int
    """Experts each token is sent to (k <= E)."""
    expert_ffn_hidden_size: int
    """Inner width of one routed expert's MLP."""
    num_shared_experts: int = 0
    """Experts every token goes through (DeepSeek, Qwen2-MoE); 0 = none."""
    shared_expert_ffn_hidden_size: int = 0
    """Inner width of one shared expert; 0 means expert_ffn_hidden_size."""
    shared_expert_gate: bool = False
    """Qwen2-MoE: a sigmoid gate (h -> 1) scales the shared experts' output."""
    router_bias: bool = False
    """The router's linear layer has a bias (learned; DeepSeek's correction bias is a buffer)."""
    capacity_factor: float = 0.0
    """Tokens an expert takes, as a multiple of an even share (tokens * k / E); overflow is
    dropped and free slots are padded, so experts compute capacity_factor * tokens * k token
    passes. 0 = dropless (exactly tokens * k)."""
    expert_groups: int = 1
    """The routed experts in this many equal groups of consecutive experts (DeepSeek's ``n_group``)."""
    groups_per_token: int | None = None
    """Group-limited routing: a token's k experts lie in at most this many of the ``expert_groups``
    (DeepSeek-V3's ``topk_group`` 4 of ``n_group`` 8; its groups align with nodes, so at most 4 nodes);
    None: any k experts."""
    routing: str = LEARNED
    """Which experts a token goes to: ``learned`` (ROUTINGS; uniform over the allowed experts on
    average) or ``fake_balanced`` (a benchmark's fixed gate); what the expert dispatch sends where."""

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "expert_ffn_hidden_size"):
            positive_int(getattr(self, name), f"moe.{name}")
        require(self.top_k <= self.num_experts, "moe.top_k",
                f"top_k({self.top_k}) > num_experts({self.num_experts})")
        for name in ("num_shared_experts", "shared_expert_ffn_hidden_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecError(f"moe.{name}", f"must be an integer >= 0, got {value!r}")
        positive_number(self.capacity_factor, "moe.capacity_factor", allow_zero=True)
        check_int_fields(self, "moe.")
        self._check_routing()

    def _check_routing(self) -> None:
        """expert_groups divides the experts; groups_per_token within it and holding k experts; a known routing."""
        positive_int(self.expert_groups, "moe.expert_groups")
        require(self.num_experts % self.expert_groups == 0, "moe.expert_groups",
                f"{self.expert_groups} does not divide num_experts({self.num_experts})")
        one_of(self.routing, ROUTINGS, "moe.routing")
        if self.groups_per_token is None:
            return
        positive_int(self.groups_per_token, "moe.groups_per_token")
        require(self.groups_per_token <= self.expert_groups, "moe.groups_per_token",
                f"{self.groups_per_token} > expert_groups({self.expert_groups})")
        allowed = self.groups_per_token * self.num_experts // self.expert_groups
        require(allowed >= self.top_k, "moe.groups_per_token",
                f"{self.groups_per_token} groups of {self.num_experts // self.expert_groups} experts hold "
                f"{allowed} < top_k({self.top_k})")

    @property
    def group_limited(self) -> bool:
        """A token's experts are confined to fewer groups than there are."""
        return self.groups_per_token is not None and self.groups_per_token < self.expert_groups

    @property
    def shared_ffn_hidden_size(self) -> int:
        """Total inner width of the shared experts (they act as one wider MLP)."""
        return self.num_shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size)

    @property
    def expert_passes_per_token(self) -> float:
        """Routed-expert MLP passes computed per token: k, or k * capacity_factor when padded."""
        return self.top_k * (self.capacity_factor or 1.0)

    def router_params(self, hidden: int) -> int:
        return self.num_experts * hidden + (self.num_experts if self.router_bias else 0)

    def params(self, hidden: int, mlp_params) -> int:
        """All parameters; ``mlp_params(width)`` counts one dense MLP of inner width ``width``."""
        total = self.router_params(hidden) + self.num_experts * mlp_params(self.expert_ffn_hidden_size)
        if self.num_shared_experts:
            total += mlp_params(self.shared_ffn_hidden_size)
        return total + (hidden if self.shared_expert_gate else 0)

    def active_params(self, hidden: int, mlp_params) -> int:
        """Parameters one token uses: router, k routed experts, shared experts."""
        total = self.router_params(hidden) + self.top_k * mlp_params(self.expert_ffn_hidden_size)
        if self.num_shared_experts:
            total += mlp_params(self.shared_ffn_hidden_size)
        return total + (hidden if self.shared_expert_gate else 0)

    def flops_per_token(self, hidden: int, mlp_matrices: int) -> float:
        """Matmul FLOPs per token: router, the routed passes, the shared experts, the gate."""
        router = 2 * hidden * self.num_experts
        routed = self.expert_passes_per_token * 2 * hidden * self.expert_ffn_hidden_size * mlp_matrices
        shared = 2 * hidden * self.shared_ffn_hidden_size * mlp_matrices
        return router + routed + shared + (2 * hidden if self.shared_expert_gate else 0)


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values pass through
    low-rank bottlenecks, keys carry a shared rotary part."""

    q_lora_rank: int = 0
    """Query bottleneck width; 0 = a plain h -> heads * qk_head_dim projection."""
    kv_lora_rank: int
    """Compressed key/value width (what the KV cache holds)."""
    qk_nope_head_dim: int
    """Per-head query/key width without rotary embedding."""
    qk_rope_head_dim: int
    """Per-head rotary width (the key part is shared by all heads)."""
    v_head_dim: int
    """Per-head value width."""

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            positive_int(getattr(self, name), f"mla.{name}")
        if isinstance(self.q_lora_rank, bool) or not isinstance(self.q_lora_rank, int) or self.q_lora_rank < 0:
            raise SpecError("mla.q_lora_rank", f"must be an integer >= 0, got {self.q_lora_rank!r}")
        check_int_fields(self, "mla.")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def matrices(self, hidden: int, heads: int) -> list[tuple[int, int]]:
        """(in, out) of each projection in order: [q_a, q_b] or [q], kv_a, kv_b, o."""
        q = heads * self.qk_head_dim
        qs = [(hidden, self.q_lora_rank), (self.q_lora_rank, q)] if self.q_lora_rank else [(hidden, q)]
        return qs + [(hidden, self.kv_lora_rank + self.qk_rope_head_dim),
                     (self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim)),
                     (heads * self.v_head_dim, hidden)]

    def params(self, hidden: int, heads: int, bias: bool) -> int:
        """Weights, the two bottleneck RMSNorms, and (with ``bias``) the biases of the
        projections that read or write the hidden state (q_a or q, kv_a, o)."""
        weights = sum(i * o for i, o in self.matrices(hidden, heads))
        norms = self.q_lora_rank + self.kv_lora_rank
        biases = 0
        if bias:
            first_q = self.q_lora_rank  # a plain q projection has no bias
            biases = first_q + self.kv_lora_rank + self.qk_rope_head_dim + hidden
        return weights + norms + biases

    def flops_per_token(self, hidden: int, heads: int, span: int) -> float:
        """Projections plus scores (qk_head_dim per head) and context (v_head_dim per head)."""
        proj = sum(2 * i * o for i, o in self.matrices(hidden, heads))
        return float(proj + 2 * span * heads * (self.qk_head_dim + self.v_head_dim))
