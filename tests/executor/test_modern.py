"""Issue 15's choices run with --check on cpu-4: Ulysses, selective recomputation (a selective
checkpoint policy), interleaved 1F1B and the vocabulary split (vocab_tp with padding, vocab_sp
megatron/ulysses, vocab_zero3). Each spawn combines several choices; a broken Ulysses fails."""
import collections
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import specs
from executor import train
from executor.checks import check_runnable
from executor.model import build_block
from executor.parallel import sequence
from executor.parallel.checkpoint import apply_ac
from executor.run import run_plan
from specs import LayerStrategy as L
from specs import Plan, SpecError

from tests.executor.conftest import assert_matches_reference


def with_vocab(model, vocab):
    """``model`` with another vocabulary size (500: padded to 512 rows, so some rows are padding)."""
    return dataclasses.replace(model, embedding=dataclasses.replace(model.embedding, vocab_size=vocab),
                               head=dataclasses.replace(model.head, output_size=vocab))


def plan(stage_layers, layers, **kwargs):
    kwargs = {"global_batch": 4, "micro_batches": 2, **kwargs}
    return Plan(pp=len(stage_layers), stage_layers=tuple(stage_layers), layers=tuple(layers), **kwargs)


INTERLEAVED_ULYSSES_VOCAB_TP = plan(
    [2, 2], [L(ulysses=2, sp="ulysses", dp_type="zero1"), L(ulysses=2, sp="ulysses", recompute="selective"),
             L(dp=2, recompute="selective"), L(tp=2, sp="megatron", recompute="selective")],
    schedule="interleaved_1f1b", virtual_stages=2, vocab_tp=2, vocab_sp="megatron")
"""pp 2 x v 2 (chunks of one layer, round-robin), Ulysses with ZeRO-1 and with selective
recomputation, relayouts to dp and Megatron-SP, the tied vocabulary split over 2 ranks with the
sequence split around it, on a 500-token vocabulary padded to 512 rows."""

ULYSSES_VOCAB_ZERO3 = plan(
    [4], [L(ulysses=2, dp=2, sp="ulysses", dp_type="zero3"), L(ulysses=4, sp="ulysses", recompute="selective"),
          L(tp=2, dp=2), L(dp=4, dp_type="zero2")], micro_batches=1, vocab_tp=2, vocab_sp="ulysses", vocab_zero3=True)
"""LLaMA (grouped-query heads repeated before the all-to-all), Ulysses of degree 2 and 4, with
ZeRO-3 and beside TP, and the embedding/head Ulysses-split with ZeRO-3 over the whole stage."""


def test_interleaved_1f1b_ulysses_selective_and_vocab_tp_on_4_ranks(tiny_gpt):
    assert_matches_reference(INTERLEAVED_ULYSSES_VOCAB_TP, with_vocab(tiny_gpt, 500), 4)


def test_the_embedding_and_the_loss_in_chunks_of_their_own_on_4_ranks(tiny_gpt):
    """Llama 3's layout in small: 4 layers on pp 2 x v 3 = 6 chunks, chunk 0 only the embedding
    (relaid into layer 0's tp 2) and chunk 5 only the head (from layer 3's tp 2); state, numerics
    and the collective trace as the reference and the cost model say."""
    p = plan([2, 2], [L(tp=2), L(dp=2), L(dp=2, dp_type="zero1"), L(tp=2)], schedule="interleaved_1f1b",
             virtual_stages=3, global_batch=8, micro_batches=4, chunk_layers=(0, 1, 1, 1, 1, 0))
    assert p.layers_per_chunk() == (0, 1, 1, 1, 1, 0)
    assert_matches_reference(p, tiny_gpt, 4)


def test_ulysses_with_zero3_and_vocab_ulysses_zero3_on_4_ranks():
    assert_matches_reference(ULYSSES_VOCAB_ZERO3, with_vocab(specs.load_model("tiny-llama"), 500), 4)


@pytest.mark.slow
@pytest.mark.parametrize("name,kwargs", [
    ("vocab_tp4", dict(vocab_tp=4)),
    ("vocab_sp megatron", dict(vocab_tp=2, vocab_sp="megatron")),
    ("vocab_sp ulysses", dict(vocab_tp=4, vocab_sp="ulysses")),
    ("vocab_zero3 at vocab_tp 1", dict(vocab_zero3=True)),
    ("vocab_tp2 zero3", dict(vocab_tp=2, vocab_zero3=True)),
])
def test_each_vocabulary_split_on_4_ranks(name, kwargs):
    llama = with_vocab(specs.load_model("tiny-llama"), 500)
    assert_matches_reference(plan([4], [L(tp=2, dp=2), L(dp=4), L(tp=4, sp="megatron"), L(tp=2, dp=2)],
                                  micro_batches=1, **kwargs), llama, 4)


@pytest.mark.slow
@pytest.mark.parametrize("name,p", [
    ("interleaved dp", plan([2, 2], [L(dp=2)] * 4, global_batch=8, micro_batches=4,
                            schedule="interleaved_1f1b", virtual_stages=2)),
    ("interleaved pp4 v2", plan([2] * 4, [L()] * 8, global_batch=4, micro_batches=4,
                                schedule="interleaved_1f1b", virtual_stages=2)),
    ("ulysses alone", plan([4], [L(ulysses=4, sp="ulysses")] * 4, micro_batches=1)),
    ("ulysses full recompute zero2", plan([4], [L(ulysses=2, dp=2, sp="ulysses", dp_type="zero2", recompute="full")] * 4)),
])
def test_more_modern_plans_on_4_ranks(tiny_gpt, name, p):
    model = tiny_gpt if len(p.layers) == 4 else dataclasses.replace(tiny_gpt, layers=tiny_gpt.layers * 2)
    assert_matches_reference(p, model, 4)


@pytest.mark.slow
def test_bert_vocabulary_split_with_transform_bias_and_token_types():
    bert = specs.load_model("tiny-bert")
    assert_matches_reference(plan([2, 2], [L(dp=2), L(tp=2), L(ulysses=2, sp="ulysses"), L(dp=2)], vocab_tp=2,
                                  vocab_sp="megatron"), bert, 4)


# -- a broken Ulysses must fail --check -----------------------------------------------------------
def ulysses_without_transpose(rank, world_size, model, plan, cfg):
    """Ulysses whose all-to-all sends contiguous blocks of [b, H, s/t, d] instead of head groups."""
    def seq_to_heads(x, group):
        t = dist.get_world_size(group)
        b, h, s, d = x.shape
        return sequence._AllToAll.apply(x.reshape(t, -1), group).reshape(b, h // t, t * s, d)

    sequence.seq_to_heads = seq_to_heads
    return train.worker(rank, world_size, model, plan, cfg)


def test_the_check_fails_on_ulysses_without_the_head_transpose(tiny_gpt):
    m = run_plan(plan([4], [L(ulysses=2, sp="ulysses")] * 4, global_batch=2, micro_batches=1), tiny_gpt, world_size=2,
                 steps=2, check=True, track_memory=False, timeout_s=120, rank_fn=ulysses_without_transpose)
    assert not m.check.passed and m.check.grad_max_abs_diff > 1e-4 and not m.check.state_bytes_errors


# -- selective recomputation: the core is recomputed, the matmuls are not ---------------------------
class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def backward_ops(model, recompute):
    torch.manual_seed(0)
    block = apply_ac(build_block(model, 0, 0), recompute)
    loss = block(torch.randn(2, model.seq_len, model.layers[0].hidden_size, requires_grad=True)).square().sum()
    with OpCounter() as counter:
        loss.backward()
    return counter.counts


def test_the_per_op_policy_reruns_every_other_matmul_and_not_the_attention_kernel():
    # torchtitan's selective-op on a Llama block (no biases: q, k, v, o, gate, up, down are mm):
    # backward re-runs k, o and up (the 2nd, 4th, 6th), keeps q, v, gate, down and the SDPA output
    model = specs.load_model("tiny-llama")
    none, per_op, full = (backward_ops(model, r) for r in ("none", "selective-op", "full"))
    core = "_scaled_dot_product_flash_attention_for_cpu"
    assert per_op[core] == 0 and full[core] == 1
    # (full re-runs six: torch's early stop ends its recompute at down's input, the last tensor kept)
    assert per_op["mm"] == none["mm"] + 3 and full["mm"] == none["mm"] + 6
    assert per_op["silu"] == full["silu"] == 1 and none["silu"] == 0  # the SwiGLU product is recomputed


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_selective_recomputation_reruns_the_attention_core_and_no_matmul(name):
    model = specs.load_model(name)
    none, selective, full = (backward_ops(model, r) for r in ("none", "selective", "full"))
    core = "_scaled_dot_product_flash_attention_for_cpu"
    assert none[core] == 0 and selective[core] == 1 and full[core] == 1
    # the projections' forward matmuls (addmm with a bias, mm without) are not re-run: backward
    # has exactly the matmuls of no recomputation; full recomputation re-runs them
    assert selective["mm"] == none["mm"] and selective["addmm"] == none["addmm"] == 0
    assert full["mm"] + full["addmm"] > none["mm"]
    norm = "native_layer_norm" if model.layers[0].norm == "layernorm" else "rsqrt"  # RMSNorm decomposes
    assert selective[norm] == 0 and full[norm] > 0  # nothing outside the attention sub-layer is re-run


def count_all_to_alls(rank, world_size, model, plan, cfg):
    """train.worker with every all_to_all_single that reaches the dispatcher counted (a
    selective checkpoint that keeps an all-to-all answers its recomputation from its cache)."""
    counter, real = OpCounter(), train.train_step

    def train_step(*args):
        with counter:
            return real(*args)

    train.train_step = train_step
    result = train.worker(rank, world_size, model, plan, cfg)
    return {**result, "all_to_alls": counter.counts["all_to_all_single"]}


@pytest.mark.slow
@pytest.mark.parametrize("recompute,per_layer", [("none", 4), ("selective", 4), ("full", 6)])
def test_selective_recomputation_does_not_rerun_the_ulysses_all_to_alls(tiny_gpt, recompute, per_layer):
    """Per layer and micro-batch: q, k and v (one all-to-all) and the output go out (2) and their
    gradients come back (2); full recomputation re-runs the forward's 2, the selective policy
    keeps them."""
    from executor.launch import launch
    p = plan([4], [L(ulysses=2, sp="ulysses", recompute=recompute)] * 4, global_batch=2, micro_batches=1)
    per_rank = launch(count_all_to_alls, 2, tiny_gpt, p, train.TrainConfig(steps=1, warmup=0, track_memory=False),
                      timeout_s=120)
    assert [r["all_to_alls"] for r in per_rank] == [4 * per_layer] * 2


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,p,message", [
    ("tiny-gpt", plan([4], [L(dp=4)] * 4, micro_batches=1, vocab_zero3=True),
     "vocab_zero3: vocab_zero3 with tied embeddings is not run"),
    ("tiny-moe", plan([4], [L(ulysses=2, dp=2, sp="ulysses", expert_tp=2)] * 4, micro_batches=1),
     "layer 0: sp ulysses on a MoE layer is not run"),
    ("tiny-gpt", plan([2, 2], [L(dp=2), L(dp=2, recompute="full"), L(dp=2), L(dp=2)], schedule="dualpipev",
                      virtual_stages=2, global_batch=8, micro_batches=4),
     "layer 1: recompute full under dualpipev is not run: torch's checkpoint re-runs a block's forward once per "
     "backward call"),
    ("tiny-llama", plan([4], [L(dp=2, cp=2, recompute="selective-op")] * 4, micro_batches=1),
     "layer 0: recompute selective-op on cp 2 is not run: the executor runs torchtitan's per-op policy on dense "
     "layers over tp and dp only"),
    ("vit-large-24", plan([24], [L(dp=4)] * 24, micro_batches=1, vocab_tp=2),
     "vocab_tp: vocabulary parallelism needs a token embedding and an lm head, got patch embedding and classifier"),
])
def test_what_the_executor_cannot_run_is_refused_in_one_line(name, p, message):
    with pytest.raises(SpecError, match=message) as err:
        check_runnable(specs.load_model(name), p, 4)
    assert "\n" not in str(err.value)


def test_every_issue_15_choice_is_accepted_before_launch(tiny_gpt):
    check_runnable(with_vocab(tiny_gpt, 500), INTERLEAVED_ULYSSES_VOCAB_TP, 4)
    check_runnable(with_vocab(specs.load_model("tiny-llama"), 500), ULYSSES_VOCAB_ZERO3, 4)
