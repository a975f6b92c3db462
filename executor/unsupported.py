"""What a Plan may say that this executor does not run: refused in one line, never dropped."""
from __future__ import annotations

from executor.model import is_tied
from executor.parallel.expert import EXPERT_DP_TYPES
from executor.parallel.vocab import refuse_vocab
from specs import LayerSpec, LayerStrategy, ModelSpec, Plan, Recompute, SpecError
from specs.capabilities import ALL_TO_ALL_ONLY, BF16_ONLY, NO_TP_OVERLAP, Capabilities, check_supported
from specs.schedules import REGISTRY, schedule_entry

CAPABILITIES = Capabilities(schedule=frozenset(s for s, e in REGISTRY.items() if e.torch_class),
                            expert_dp_type=frozenset(EXPERT_DP_TYPES),
                            precision=BF16_ONLY, tp_comm_overlap=NO_TP_OVERLAP, ep_dispatcher=ALL_TO_ALL_ONLY)
"""The axes the executor runs in part: the registered schedules torch.distributed.pipelining has a class for,
expert states held as flat buckets (no ZeRO-3 of the experts), BF16 linear layers (no FP8 recipe is wired
to torchao or Transformer Engine yet) and no TP communication overlap (its DTensor TP runs each collective
apart from its matmul); its experts' dispatch is a plain all-to-all (no DeepEP). Every other value runs (every
cp_comm: ring, all-gather, Ulysses + ring), torchtitan's per-op checkpointing (selective-op) on dense layers
without cp or Ulysses (refuse_unsupported)."""


def refuse_unsupported(plan: Plan, model: ModelSpec) -> None:
    """SpecError naming the first field the executor cannot honour for ``model``: its
    capabilities first, then recomputation under a split backward, then what depends on the
    model (cp or Ulysses beside experts, cp beside windows or Megatron-SP, the vocabulary)."""
    check_supported(plan, model, CAPABILITIES, "executor")
    split_backward = plan.pp > 1 and schedule_entry(plan.schedule).splits_backward  # pp 1: the accumulation loop
    for i, (s, spec) in enumerate(zip(plan.layers, model.layers)):
        if split_backward and s.recompute != Recompute.NONE:
            raise SpecError(f"layer {i}", f"recompute {s.recompute} under {plan.schedule} is not run: torch's "
                            f"checkpoint re-runs a block's forward once per backward call, so the split "
                            f"backward's input- and weight-gradient passes would run it twice where the plan "
                            f"counts it once")
        if s.recompute == Recompute.SELECTIVE_OP and (s.cp > 1 or s.ulysses > 1 or spec.moe is not None):
            what = f"cp {s.cp}" if s.cp > 1 else f"ulysses {s.ulysses}" if s.ulysses > 1 else "a MoE layer"
            raise SpecError(f"layer {i}", f"recompute selective-op on {what} is not run: the executor runs "
                            f"torchtitan's per-op policy on dense layers over tp and dp only")
        if s.cp > 1:
            _refuse_cp(i, s, spec)
        if s.ulysses > 1 and spec.moe is not None:
            raise SpecError(f"layer {i}", f"sp ulysses on a MoE layer is not run: the experts would see "
                            f"sequence chunks of degree {s.ulysses} that their groups do not sum over")
    refuse_vocab(plan, model, is_tied(model))


def _refuse_cp(i: int, s: LayerStrategy, spec: LayerSpec) -> None:
    """cp runs on dense blocks of full attention; under Megatron-SP tp splits each cp chunk."""
    if spec.moe is not None:
        raise SpecError(f"layer {i}", f"cp {s.cp} on a MoE layer is not run: the experts would see sequence "
                        f"chunks of degree {s.cp} that their groups do not sum over")
    if 0 < spec.attention_window < spec.seq_len:
        raise SpecError(f"layer {i}", f"cp {s.cp} with attention window {spec.attention_window} < seq "
                        f"{spec.seq_len} is not run: the ring attends over the whole sequence")
    if s.megatron_sp and spec.seq_len % (s.cp * s.tp):
        raise SpecError(f"layer {i}", f"sp megatron with cp {s.cp}: tp {s.tp} does not divide the "
                        f"{spec.seq_len // s.cp} tokens of a cp chunk")
