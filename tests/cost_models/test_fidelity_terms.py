"""Terms added for fidelity (issue 17), each on a case small enough to work out by hand."""
from dataclasses import replace

import pytest

from cost_models.analytical import AnalyticalModel
from cost_models.constants import AnalyticalConstants
from cost_models.memory import activation_bytes
from cost_models.ops import (FLASH_BACKWARD_FLOPS_FACTOR, backward_ops, forward_ops, fused_softmax_available,
                             head_backward_ops, head_forward_ops)
from cost_models.sequence import attention_core_ops
from specs import HeadSpec, LayerSpec, LayerStrategy, Recompute, SpecError, load_cluster, load_model

GPT = LayerSpec(kind="gpt", hidden_size=1024, num_heads=16, ffn_hidden_size=4096, seq_len=1024)


def test_flash_keeps_no_s_squared_activations_worked_by_hand():
    # eager (Korthikanti): s b h (34 + 5 a s / h) = 1024 * 1024 * (34 + 5 * 16 * 1024 / 1024)
    eager = activation_bytes(GPT, LayerStrategy(), 1)
    assert eager == 1024 * 1024 * (34 + 80)
    # flash: the same 34 s b h, and 4 bytes of log-sum-exp per token and head instead of 5 a s^2 b
    flash = activation_bytes(replace(GPT, attention="flash"), LayerStrategy(), 1)
    assert flash == 1024 * 1024 * 34 + 1024 * 16 * 4
    # tp 2 splits the attention terms: 10 + 24/2 s b h, and the log-sum-exp of 8 heads
    flash_tp2 = activation_bytes(replace(GPT, attention="flash"), LayerStrategy(tp=2), 1)
    assert flash_tp2 == 1024 * 1024 * (10 + 12) + 1024 * 8 * 4


def test_flash_kernel_flops_and_its_backward():
    flash = replace(GPT, attention="flash")
    eager_ops, flash_ops = forward_ops(GPT, 1, 2), forward_ops(flash, 1, 2)
    # same matmul FLOPs forward (4 b s^2 h for scores + context), four kernels fewer
    assert sum(o.flops for o in flash_ops) == sum(o.flops for o in eager_ops)
    assert len(eager_ops) - len(flash_ops) == 3
    kernel = next(o for o in flash_ops if o.name == "flash_attn")
    assert kernel.flops == 4 * 2 * 1024 * 1024 * 1024
    bwd = next(o for o in backward_ops(flash_ops) if o.name == "flash_attn_bwd")
    assert bwd.flops == FLASH_BACKWARD_FLOPS_FACTOR * kernel.flops


def test_flash_makes_long_sequences_faster_and_smaller():
    cluster = load_cluster("dgx-h100")
    model = load_model("llama2-7b").with_seq_len(8192).with_attention("eager")
    cm = AnalyticalModel(cluster)
    eager = cm.layer_time(model.layers[0], LayerStrategy(tp=8), 1, 1)
    flash = cm.layer_time(model.with_attention("flash").layers[0], LayerStrategy(tp=8), 1, 1)
    assert flash.forward_s < eager.forward_s
    assert activation_bytes(model.with_attention("flash").layers[0], LayerStrategy(tp=8), 1) < \
        activation_bytes(model.layers[0], LayerStrategy(tp=8), 1) / 2


def test_unknown_attention_is_a_clear_error():
    with pytest.raises(SpecError, match="attention"):
        load_model("tiny-gpt").with_attention("sparse")


def test_tp_allreduce_hides_behind_host_launches_when_launch_bound():
    """Host-bound layer: 13 forward kernels at 1 ms each = 13 ms of host time; the GPU work is
    tiny. The two TP all-reduces of the pass (alpha 1 ms each here) run while the host keeps
    launching, so the pass takes 13 ms in all: compute 11 ms + comms 2 ms."""
    c = AnalyticalConstants(host_time_per_kernel_s=1e-3, collective_base_latency_s=1e-3,
                            step_latency_factor=0.0, bus_efficiency=1.0)
    cm = AnalyticalModel(load_cluster("dgx-a100-80g"), constants=c)
    tiny = LayerSpec(kind="gpt", hidden_size=64, num_heads=8, ffn_hidden_size=256, seq_len=256)  # fused softmax
    alone = cm.layer_time(tiny, LayerStrategy(tp=1, dp=2), 1, 1)
    split = cm.layer_time(tiny, LayerStrategy(tp=2), 1, 1)
    assert alone.forward_s == pytest.approx(13e-3)
    comm = cm.collective_time("all_reduce", 256 * 64 * 2, [[0, 1]])
    assert comm == pytest.approx(1e-3, rel=1e-3)
    assert split.forward_s == pytest.approx(13e-3 - 2 * comm)
    assert split.forward_s + split.tp_comm_s / 2 == pytest.approx(13e-3)  # forward + its 2 all-reduces


def test_error_band_turns_a_prediction_into_an_interval():
    cm = AnalyticalModel(load_cluster("dgx-a100-80g"), cv_error_p10=-0.2, cv_error_p90=0.25)
    lo, hi = cm.time_interval_s(1.0)  # measured = predicted / (1 + error)
    assert (lo, hi) == pytest.approx((0.8, 1.25))
    with pytest.raises(SpecError, match="cv_error_p10"):
        AnalyticalConstants(cv_error_p10=0.1, cv_error_p90=0.0)


def test_pipeline_send_shares_the_links_with_the_stages_other_senders():
    """titan-8, pp 2 over dp 4: the four GPUs of stage 0 send to stage 1 at once through their
    switch's 5 GB/s uplink, so each send sees 1.25 GB/s, not 5 (as the simulator plays it)."""
    c = AnalyticalConstants()
    model = AnalyticalModel(load_cluster("titan-8"), constants=c)
    alpha = 10e-6 + c.collective_base_latency_s
    nbytes = 8e6
    assert model.p2p_time(nbytes, 0, 4) == pytest.approx(alpha + nbytes / (5e9 * c.p2p_efficiency))
    assert model.p2p_time(nbytes, 0, 4, senders=4) == pytest.approx(alpha + nbytes / (1.25e9 * c.p2p_efficiency))
    assert model.p2p_time(nbytes, 0, 1, senders=1) == pytest.approx(alpha + nbytes / (12e9 * c.p2p_efficiency))


def test_megatron_pipeline_messages_scatter_and_gather_under_tensor_parallelism():
    """Megatron's scatter_gather_tensors_in_pipeline: a GPT block's output of one micro-batch
    of 2 x 1024 tokens x 2048 hidden is 8 MiB in 16 bits; at tp 4 each rank sends 2 MiB and
    the receiving tp group all-gathers the 8 MiB; under sequence parallelism the output is
    already split: 2 MiB and no gather; at tp 1 the whole 8 MiB."""
    model = AnalyticalModel(load_cluster("dgx-a100-80g:2"))
    layer = load_model("gpt-1.7b").scaled(hidden_size=2048, seq_len=1024).layers[0]
    whole = 2 * 1024 * 2048 * 2
    msg = model.pipeline_message(layer, LayerStrategy(tp=4), 2)
    assert (msg.send_bytes, msg.gather_tp, msg.gather_bytes) == (whole / 4, 4, whole)
    assert msg.gather_groups(8, 8) == ((8, 9, 10, 11), (12, 13, 14, 15))
    sp = model.pipeline_message(layer, LayerStrategy(tp=4, sp="megatron"), 2)
    assert (sp.send_bytes, sp.gather_tp) == (whole / 4, 1)
    assert model.pipeline_message(layer, LayerStrategy(), 2).send_bytes == whole
    # across the nodes the slice is what crosses the NICs: the send time is the slice's plus
    # the NVLink all-gather on the receiving node
    sent = model.pipeline_send_time(layer, LayerStrategy(tp=4), 2, 0, 8, 8)
    assert sent == pytest.approx(model.p2p_time(whole / 4, 0, 8, 8)
                                 + model.collective_time("all_gather", whole, [[8, 9, 10, 11], [12, 13, 14, 15]]))
    assert sent < model.p2p_time(whole, 0, 8, 8)


@pytest.mark.parametrize("attn_batches, queries, keys, causal, fused", [
    (4, 1024, 1024, True, True),      # 16 heads / tp 4, micro-batch 1
    (2, 1024, 1024, True, False),     # 16 heads / tp 8, micro-batch 1: b x np = 2 is not a multiple of 4
    (12, 2048, 2048, True, True),
    (6, 2048, 2048, True, False),     # 48 heads / tp 16 (18.4B), micro-batch 2
    (4, 64, 64, True, False),         # rows of <= 128 keys: 8 a block, so causal needs b x np % 8
    (8, 64, 64, True, True),
    (4, 64, 64, False, True),         # padding mask: queries % 8 instead
    (4, 16, 16, True, False),         # 16 < keys
    (4, 8192, 8192, True, False),     # keys <= 4096
    (4, 196, 49, False, False),       # a Swin window: keys % 4
])
def test_megatron_fused_softmax_availability(attn_batches, queries, keys, causal, fused):
    """Megatron's FusedScaleMaskSoftmax.is_kernel_available, case by case."""
    assert fused_softmax_available(attn_batches, queries, keys, causal) is fused


def test_unfused_softmax_is_five_fp32_kernels_each_way_worked_by_hand():
    """h 1024, 16 heads, s 1024. tp 8, micro-batch 1: 2 score matrices per rank, not fused:
    cast (2 + 4), scale (4 + 4), masked_fill (4 + 4), softmax (4 + 4), cast back (4 + 2) = 36 bytes
    per score forward, 40 backward (6 + 8 + 8 + 12 + 6), in 5 kernels each. Micro-batch 2 gives 4
    matrices: one fused kernel, 2 + 2 bytes forward and 6 backward."""
    scores = 1024 * 1024
    unfused = [o for o in forward_ops(GPT, 8, 1) if o.name.startswith("softmax")]
    assert len(unfused) == 5 and sum(o.nbytes for o in unfused) == 36 * 2 * scores
    unfused_bwd = [o for o in backward_ops(unfused)]
    assert len(unfused_bwd) == 5 and sum(o.nbytes for o in unfused_bwd) == 40 * 2 * scores
    fused = [o for o in forward_ops(GPT, 8, 2) if o.name.startswith("softmax")]
    assert len(fused) == 1 and fused[0].nbytes == 4 * 4 * scores
    assert backward_ops(fused)[0].nbytes == 6 * 4 * scores
    # selective recomputation re-runs every step of the softmax, fused or not
    core = attention_core_ops(forward_ops(GPT, 8, 1))
    assert [o.name for o in core] == ["scores", *(o.name for o in unfused), "attn_dropout", "context"]


def test_unfused_softmax_makes_the_launch_bound_layer_slower():
    """tp 8, micro-batch 1 (the vTrain runs whose time the fused-kernel model missed): 4 more
    kernels per pass (five in place of one) cost a host launch each where the layer is launch-bound."""
    c = AnalyticalConstants(host_time_per_kernel_s=1e-4)
    cm = AnalyticalModel(load_cluster("dgx-a100-80g"), constants=c)
    fused_heads = replace(GPT, num_heads=32)  # 4 score matrices per rank at tp 8: fused
    slow = cm.layer_time(GPT, LayerStrategy(tp=8, recompute=Recompute.FULL), 1, 1)
    fast = cm.layer_time(fused_heads, LayerStrategy(tp=8, recompute=Recompute.FULL), 1, 1)
    assert len(forward_ops(GPT, 8, 1)) - len(forward_ops(fused_heads, 8, 1)) == 4
    assert slow.forward_s - fast.forward_s == pytest.approx(4 * 1e-4, rel=1e-6)
    assert slow.backward_s - fast.backward_s == pytest.approx(2 * 4 * 1e-4, rel=1e-6)  # backward + recompute


def test_vocab_parallel_loss_is_megatrons_passes_over_the_logits_worked_by_hand():
    """2 samples of 8 tokens, vocabulary 1024 over tp 4: 16 x 256 = 4096 logits a rank.
    Forward: cast to fp32 (2 + 4), max (4), subtract it (4 + 4), exp (4 + 4), sum (4), divide
    (4 + 4) = 38 bytes a logit in 6 kernels; backward: scale by the output gradient (4 + 4), cast
    back (4 + 2) = 14 bytes in 2. The logits GEMM is 2 x 16 x 256 x 64 FLOPs each way."""
    head = HeadSpec(kind="lm", hidden_size=64, output_size=1024, seq_len=8)
    fwd = head_forward_ops(head, 2, 4)
    assert [o.name for o in fwd] == ["logits", "loss_to_fp32", "loss_max", "loss_subtract_max", "loss_exp",
                                     "loss_sum", "loss_normalise"]
    assert fwd[0].flops == 2 * 16 * 256 * 64 and sum(o.nbytes for o in fwd[1:]) == 38 * 4096
    bwd = head_backward_ops(head, 2, 4)
    assert [o.name for o in bwd] == ["loss_scale_grad", "loss_to_fp16", "logits_dgrad", "logits_wgrad"]
    assert sum(o.nbytes for o in bwd[:2]) == 14 * 4096
    assert bwd[2].flops == bwd[3].flops == fwd[0].flops
