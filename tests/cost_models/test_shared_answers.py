"""The analytical model shares parts of a layer's time across strategies (the kernels and TP, cp
and expert traffic across dp types; the data-parallel sync across recompute): every answer must
be the one it gives with nothing shared, and not depend on what was asked before."""
from __future__ import annotations

import itertools

import cost_models
from cost_models import analytical
from specs import LayerSpec, LayerStrategy, load_cluster
from specs.layer_parts import MoESpec

CLUSTER = load_cluster("dgx-h100:2")
DENSE = LayerSpec(kind="gpt", hidden_size=1024, num_heads=16, ffn_hidden_size=4096, seq_len=2048)
MOE = LayerSpec(kind="moe", hidden_size=1024, num_heads=16, ffn_hidden_size=2048, gated_ffn=True, seq_len=2048,
                bias=False, norm="rmsnorm", moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))
LAYOUTS = (dict(dp=16), dict(tp=2, dp=8, sp="megatron"), dict(tp=4, dp=4, tp_consecutive=False),
           dict(ulysses=2, sp="ulysses", dp=8), dict(tp=2, cp=2, dp=4))
QUESTIONS = ((1, 4), (2, 8))
"""(micro-batch size, micro-batches)."""


def _strategies(layer: LayerSpec) -> list[LayerStrategy]:
    layouts = LAYOUTS + ((dict(dp=16, ep=4), dict(tp=2, dp=8, ep=2)) if layer.moe else ())
    return [LayerStrategy(**layout, dp_type=dp_type, recompute=recompute)
            for layout, dp_type, recompute in itertools.product(layouts, ("ddp", "zero2", "zero3"),
                                                                ("none", "selective", "full"))]


def _answers(order: list[LayerStrategy], layer: LayerSpec) -> dict:
    cm = cost_models.get("analytical", CLUSTER)
    return {(s, q): cm.layer_time(layer, s, *q) for s, q in itertools.product(order, QUESTIONS)}


def test_shared_layer_time_parts_change_no_answer(monkeypatch):
    for layer in (DENSE, MOE):
        strategies = _strategies(layer)
        shared, backwards = _answers(strategies, layer), _answers(strategies[::-1], layer)
        with monkeypatch.context() as m:  # every strategy its own key: nothing shared
            m.setattr(analytical, "_compute_strategy", lambda s: s)
            m.setattr(analytical, "_sync_strategy", lambda s: s)
            alone = _answers(strategies, layer)
        assert shared == alone == backwards
