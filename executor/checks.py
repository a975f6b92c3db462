"""Reject, before launch, a plan the executor cannot run, with the reason in one line."""
from __future__ import annotations

from types import SimpleNamespace

from executor.parallel.expert import check_moe
from executor.unsupported import refuse_unsupported
from specs import LayerSpec, ModelSpec, Plan, SpecError


def check_runnable(model: ModelSpec, plan: Plan, world_size: int) -> None:
    """Raise SpecError naming the field and the numbers if ``plan`` cannot run on ``world_size``
    processes: the plan's own rules plus what the executor's sharding needs."""
    if world_size < 1:
        raise SpecError("world_size", f"must be >= 1, got {world_size}")
    plan.validate(model, SimpleNamespace(world_size=world_size))
    refuse_unsupported(plan, model)
    for i, spec in enumerate(model.layers):
        _check_buildable(i, spec)
    for i, (s, spec) in enumerate(zip(plan.layers, model.layers)):
        check_moe(i, spec, s)
        if s.megatron_sp and (spec.cross_attention_seq_len or spec.downsample_to):
            raise SpecError(f"layer {i}", "sp is not supported on blocks with cross-attention or patch merging")
        if s.megatron_sp and spec.seq_len % s.tp:
            raise SpecError(f"layer {i}", f"sp: tp({s.tp}) does not divide seq_len({spec.seq_len})")
        if spec.kv_heads % s.tp:  # Ulysses splits tokens, not weights (kv heads repeated first)
            raise SpecError(f"layer {i}", f"tp({s.tp}) does not divide kv heads({spec.kv_heads})")
        if spec.ffn_hidden_size % s.tp:
            raise SpecError(f"layer {i}", f"tp({s.tp}) does not divide ffn_hidden_size({spec.ffn_hidden_size})")
    _check_chain(model)


def _check_buildable(i: int, spec: LayerSpec) -> None:
    """The blocks of executor.model build q/k/v/o attention and a dense MLP with one bias flag;
    refuse what they would silently build differently (experts, MLA, sliding windows...)."""
    unsupported = [name for name, used in (
        ("mla", spec.mla is not None),
        (f"sliding_window({spec.sliding_window})", 0 < spec.sliding_window < spec.seq_len),
        ("qk_norm", spec.qk_norm), ("sandwich_norm", spec.sandwich_norm),
        ("per-projection biases", {spec.qkv_bias, spec.out_bias, spec.mlp_bias} - {None, spec.bias}),
    ) if used]
    if unsupported:
        raise SpecError(f"layer {i}", f"the executor cannot build {', '.join(unsupported)} yet")


def _check_chain(model: ModelSpec) -> None:
    """Each layer must accept what the previous one outputs (a scaled Swin can break this)."""
    width = model.embedding.hidden_size
    for i, layer in enumerate(model.layers):
        if layer.hidden_size != width:
            raise SpecError(f"layer {i}", f"hidden_size({layer.hidden_size}) != previous output width({width})")
        if layer.attention_window and layer.attention_window < layer.seq_len and layer.seq_len % layer.attention_window:
            raise SpecError(f"layer {i}", f"attention_window({layer.attention_window}) does not divide "
                            f"seq_len({layer.seq_len})")
        if layer.downsample_to and layer.seq_len % 4:
            raise SpecError(f"layer {i}", f"patch merging needs seq_len({layer.seq_len}) divisible by 4")
        width = layer.downsample_to or layer.hidden_size
    if model.head.hidden_size != width:
        raise SpecError("head.hidden_size", f"{model.head.hidden_size} != last layer output width({width})")
