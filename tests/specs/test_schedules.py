"""The schedule registry: op orders, in-flight counts and the formula on cases worked out by hand,
the micro-batch rules' messages, and the upgrade of plan files that spelled interleaving as 1f1b."""
import pytest

from specs import Plan, SpecError, chunk_layout, uniform_plan
from specs.schedules import (REGISTRY, SCHEDULES, Op, OpKind, Schedule, schedule_entry, upgrade_schedule,
                             weighted_in_flight)

F, B, W = OpKind.FORWARD, OpKind.BACKWARD, OpKind.WEIGHT


def ops(kind_mb_chunk: str) -> list[Op]:
    """'F0 B0.1' -> [Op(F, 0, 0), Op(B, 0, 1)] (micro-batch, then the chunk after a dot)."""
    out = []
    for token in kind_mb_chunk.split():
        mb, _, chunk = token[1:].partition(".")
        out.append(Op(OpKind(token[0]), int(mb), int(chunk or 0)))
    return out


@pytest.mark.parametrize("schedule, stage0, stage1", [
    ("gpipe", "F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3"),
    # stage 0 warms up with pp - 0 - 1 = 1 forward; the last stage alternates from the start
    ("1f1b", "F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"),
])
def test_op_order_on_2_stages_and_4_micro_batches(schedule, stage0, stage1):
    entry = schedule_entry(schedule)
    assert entry.ops(0, 2, 4) == ops(stage0)
    assert entry.ops(1, 2, 4) == ops(stage1)


def test_interleaved_op_order_on_2_stages_2_chunks_and_4_micro_batches():
    """Forwards take micro-batches in groups of pp = 2 through chunk 0, then chunk 1; backwards
    walk the chunks in reverse. Warm-up: 2 (pp - k - 1) + (v - 1) pp = 4 on stage 0, 2 on stage 1."""
    entry = schedule_entry("interleaved_1f1b")
    assert entry.ops(0, 2, 4, 2) == ops("F0.0 F1.0 F0.1 F1.1 "
                                        "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
                                        "B2.1 B3.1 B2.0 B3.0")
    assert entry.ops(1, 2, 4, 2) == ops("F0.0 F1.0 "
                                        "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
                                        "B2.0 B3.0")


def test_zero_bubble_h1_op_order_on_2_stages_and_4_micro_batches():
    """1F1B's order with B split off; stage 0 runs W right after each B, stage 1 (k = 1) starts
    its W one step late (W0 after B1) and runs the last one, W3, at the end."""
    entry = schedule_entry("zb_h1")
    assert entry.ops(0, 2, 4) == ops("F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3")
    assert entry.ops(1, 2, 4) == ops("F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3")


def test_v_shape_op_orders_on_2_stages_and_4_micro_batches():
    """ZB-V, stage 0 (k = 0): 2 (pp - k) - 1 = 3 F of chunk 0; no F1 F0 pair; pp - k = 2 of
    F1 B1 W1; steady F0 B0 W0 F1 B1 W1 until chunk 1 caught up (1 round: F3.0 ... W2.1); the
    cool-down B0 W0 twice. Stage 1: 1 F0; one pair F1 F0; one F1 B1 W1; two steady rounds; then
    B0 B1, B0 W0 and the W left (W3.1, W3.0).
    DualPipeV, stage 0 (r = pp - k - 1 = 1): F0.0 F1.0; the pair F2.0 F0.1; B0.1 with its W run
    at once (the queue's oldest), F1.1; one round F3.0 BW1.1 F2.1 BW0.0; r: BW2.1 F3.1 BW1.0;
    k + 1 = 1: BW3.1, then B2.0 split (stage 0 is even: from the middle on); W2.0 B3.0; W3.0."""
    zbv, dual = schedule_entry("zbv"), schedule_entry("dualpipev")
    assert zbv.ops(0, 2, 4, 2) == ops("F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 "
                                      "F3.0 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 W1.0 F3.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0")
    assert zbv.ops(1, 2, 4, 2) == ops("F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 "
                                      "F3.0 B1.0 W1.0 F3.1 B2.1 W2.1 B2.0 B3.1 B3.0 W2.0 W3.1 W3.0")
    assert dual.ops(0, 2, 4, 2) == ops("F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 "
                                       "B2.1 W2.1 F3.1 B1.0 W1.0 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0")
    assert [zbv.stage_chunks(k, 2, 2) for k in (0, 1)] == [[0, 3], [1, 2]]
    assert zbv.chunk_sends(1, 2, 2) == ([2], [1])  # chunk 1 -> 2 and 2 -> 1 stay on stage 1


def test_looped_bfs_op_order():
    """All of chunk 0, all of chunk 1, then the backwards from the last chunk, newest first."""
    assert schedule_entry("looped_bfs").ops(1, 2, 2, 2) == ops("F0.0 F1.0 F0.1 F1.1 B1.1 B0.1 B1.0 B0.0")


def test_in_flight_counts_by_hand():
    """GPipe holds every micro-batch; 1F1B pp - k; interleaving (2 (pp - k - 1) + (v - 1) pp + 1)
    chunk-micro-batches of 1/v of the stage each: 5/2 and 3/2 on 2 stages, v 2."""
    assert [schedule_entry("gpipe").in_flight(2, k, 4) for k in (0, 1)] == [4, 4]
    assert [schedule_entry("1f1b").in_flight(2, k, 4) for k in (0, 1)] == [2, 1]
    assert [schedule_entry("interleaved_1f1b").in_flight(2, k, 4, 2) for k in (0, 1)] == [2.5, 1.5]
    # a split backward holds a micro-batch until its W. ZB-H1: stage 1 has F0 B0 F1 before W0 -> 2
    assert [schedule_entry("zb_h1").in_flight(2, k, 4) for k in (0, 1)] == [2, 2]
    # ZB-V stage 0: F0.0 F1.0 F2.0 F0.1 = 4 chunk-micro-batches of half the stage -> 2
    assert [schedule_entry("zbv").in_flight(2, k, 4, 2) for k in (0, 1)] == [2, 2]
    # DualPipeV stage 0: 4, one W, F1.1 F3.0 -> 5 halves; stage 1: F0.0 F0.1 F1.0 F1.1 F2.0 -> 5 halves
    assert [schedule_entry("dualpipev").in_flight(2, k, 4, 2) for k in (0, 1)] == [2.5, 2.5]
    assert [schedule_entry("looped_bfs").in_flight(2, k, 4, 2) for k in (0, 1)] == [4, 4]


def played_peak(program: list[Op], releases: OpKind) -> int:
    """Most chunk-micro-batches forwarded and not yet released (by their B, or by their W where
    the backward is split) at any point of ``program``."""
    held = peak = 0
    for op in program:
        held += 1 if op.kind == F else -1 if op.kind == releases else 0
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_in_flight_is_the_peak_of_the_op_order(schedule):
    """The count the cost models charge is the most chunk-micro-batches forwarded and not yet
    released (B, or W under a split backward) at any point of the stage's program (in stage
    units: / v), on every stage of every pp up to 8, micro-batch count up to 4 pp + 4 and chunk
    count up to 4 the schedule runs (the split-backward ones, whose counts are closed forms,
    also below their least micro-batch count)."""
    entry = schedule_entry(schedule)
    releases = W if entry.splits_backward else B
    for pp in range(1, 9):
        for m in range(1, 4 * pp + 5):
            for v in range(entry.min_virtual_stages, min(entry.max_virtual_stages, 4) + 1):
                if not entry.allows(pp, m, v) and not (entry.splits_backward and entry.allows(pp, 2 * pp, v)):
                    continue
                for stage in range(pp):
                    peak = played_peak(entry.ops(stage, pp, m, v), releases)
                    assert entry.in_flight(pp, stage, m, v) == pytest.approx(peak / v), (pp, m, v, stage)


@pytest.mark.parametrize("pp, m", [(4, 8), (3, 6), (4, 12)])
def test_every_stage_runs_each_forward_and_backward_once(pp, m):
    for entry in REGISTRY.values():
        v = entry.min_virtual_stages
        kinds = (F, B, W) if entry.splits_backward else (F, B)
        for stage in range(pp):
            program = entry.ops(stage, pp, m, v)
            assert sorted(program) == sorted(Op(k, mb, c) for k in kinds for mb in range(m) for c in range(v))
            if entry.splits_backward:  # W after its own B
                assert all(program.index(Op(W, op.micro_batch, op.chunk)) > i
                           for i, op in enumerate(program) if op.kind == B)


def test_the_formula_and_its_linear_form():
    """T = (1, 2) s, D = (0.1, 0.3) s, m = 4: 4 * 2 + (3 - 2) / v + 0.3."""
    one = schedule_entry("1f1b").formula(4)
    assert (one.fill, one.steady) == (1.0, 3.0)
    assert one.time_s(2.0, 3.0, 0.3) == pytest.approx(9.3)
    assert one.linear_s(3.0, 2.0, 0.3) == pytest.approx(9.3)  # sum + (m - 1) max + max D
    two = schedule_entry("interleaved_1f1b").formula(4, 2)
    assert (two.fill, two.steady) == (0.5, 3.5)
    assert two.time_s(2.0, 3.0, 0.3) == pytest.approx(8.8)
    assert two.linear_s(3.0, 2.0, 0.3) == pytest.approx(8.8)


@pytest.mark.parametrize("schedule, pp, m, v, message", [
    ("1f1b", 4, 3, 1, r"micro_batches: 1f1b needs micro_batches\(3\) >= pp\(4\)"),
    ("interleaved_1f1b", 4, 6, 2,
     "micro_batches: interleaved 1F1B needs micro-batches a multiple of pp: micro_batches 6, pp 4"),
    ("interleaved_1f1b", 1, 4, 2, r"virtual_stages: virtual_stages 2 needs pp > 1 \(pp is 1\)"),
    ("interleaved_1f1b", 2, 4, 1, "virtual_stages: interleaved_1f1b needs virtual_stages >= 2, got 1"),
    ("gpipe", 2, 4, 2,
     r"virtual_stages: virtual_stages 2 needs schedule interleaved_1f1b \(gpipe runs one model chunk per rank\)"),
    ("zb_h1", 4, 3, 1, r"micro_batches: zb_h1 needs micro_batches\(3\) >= pp\(4\)"),
    ("zb_h1", 4, 9, 1, r"micro_batches: zb_h1 needs micro-batches a multiple of its rounds \(torch's ZB1P\): "
                       r"micro_batches 9, rounds 9 // pp 4 = 2"),
    ("zbv", 4, 8, 3, "virtual_stages: zbv needs virtual_stages 2, got 3"),
    ("zbv", 1, 8, 2, r"pp: zbv needs pp > 1 \(pp is 1\): its V turns on the last stage"),
    ("dualpipev", 4, 7, 2, r"micro_batches: dualpipev needs micro_batches\(7\) >= 2 \* pp\(4\) = 8 "
                           r"\(one per chunk of the V\)"),
    ("looped_bfs", 1, 4, 2, r"virtual_stages: virtual_stages 2 needs pp > 1 \(pp is 1\)"),
])
def test_rules_name_the_numbers(schedule, pp, m, v, message):
    entry = schedule_entry(schedule)
    with pytest.raises(SpecError, match=f"^{message}$"):
        entry.check(pp, m, v)
    assert not entry.allows(pp, m, v)


def test_gpipe_takes_any_micro_batches():
    assert schedule_entry("gpipe").allows(8, 1, 1)


def test_interleaving_takes_any_layer_count():
    """126 layers on pp 16 x v 2 = 32 chunks: with the embedding and the loss counted as one layer
    each, 128 / 32 = 4 per chunk, so chunks 0 and 31 hold 3. Stage 0 runs chunks 0 and 16
    (3 + 4 = 7), stage 15 runs chunks 15 and 31 (4 + 3 = 7), the others 8."""
    plan = uniform_plan(126, pp=16, global_batch=32, micro_batches=16, schedule="interleaved_1f1b",
                        virtual_stages=2)
    assert plan.chunk_layers == (3,) + (4,) * 30 + (3,)
    assert plan.stage_layers == (7,) + (8,) * 14 + (7,)
    assert list(plan.stage_ranges()[0]) == [0, 1, 2] + list(range(63, 67))  # chunk 16 starts at 3 + 15 * 4
    assert Plan.from_dict(plan.to_dict()) == plan
    # 126 on pp 8 x v 2: 128 / 16 = 8, so the end chunks hold 7 and the end stages 15
    assert chunk_layout(126, 8, 2) == ((15,) + (16,) * 6 + (15,), (7,) + (8,) * 14 + (7,))
    # layers that divide keep equal chunks (and the plan file keeps no chunk_layers)
    even = uniform_plan(96, pp=8, global_batch=32, micro_batches=8, schedule="interleaved_1f1b", virtual_stages=2)
    assert even.chunk_layers == () and even.layers_per_chunk() == (6,) * 16 and "chunk_layers" not in even.to_dict()


def test_llama3_layout_gives_the_embedding_and_the_loss_chunks_of_their_own():
    """126 layers on pp 16 x v 8 = 128 chunks (Llama 3 405B): one layer a chunk, chunk 0 only the
    embedding and chunk 127 only the loss. Stage 0 runs chunks 0, 16, ..., 112 (7 layers), stage
    15 chunks 15, ..., 127 (7), the others 8; the first layer's input comes by p2p from chunk 0."""
    plan = uniform_plan(126, pp=16, global_batch=32, micro_batches=16, schedule="interleaved_1f1b",
                        virtual_stages=8)
    assert plan.chunk_layers == (0,) + (1,) * 126 + (0,)
    assert plan.stage_layers == (7,) + (8,) * 14 + (7,)
    assert list(plan.stage_ranges()[0]) == [15, 31, 47, 63, 79, 95, 111]  # chunk 16j holds layer 16j - 1
    assert plan.chunk_starts() == set(range(126))
    assert (plan.boundary_layer(0), plan.boundary_layer(1), plan.boundary_layer(126)) == (0, 0, 125)
    assert Plan.from_dict(plan.to_dict()) == plan
    # a split backward runs its first chunk's whole backward at W: no layerless chunk there
    with pytest.raises(SpecError, match=r"^virtual_stages: 126 layers leave a chunk empty on pp\(16\) \* "
                                        r"virtual_stages\(8\) = 128 chunks$"):
        chunk_layout(126, 16, 8, "dualpipev")


def test_equal_chunk_shares_play_to_the_closed_form_in_flight():
    """weighted_in_flight plays the program chunk by chunk; with every chunk 1/v of the stage it
    is each schedule's closed-form in_flight, on every stage."""
    for name, entry in REGISTRY.items():
        for pp, v, m in ((2, 1, 3), (4, 1, 8), (4, 2, 8), (3, 3, 6), (8, 2, 16), (4, 2, 4)):
            if name in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZB_H1) and v > 1 or not entry.allows(pp, m, v):
                continue
            for k in range(pp):
                assert weighted_in_flight(name, pp, k, m, v, (1 / v,) * v) == pytest.approx(
                    entry.in_flight(pp, k, m, v)), (name, pp, v, m, k)


def test_a_layerless_chunk_holds_nothing_at_the_peak():
    """Stage 1 of pp 2 x v 4 with chunks of 1, 1, 1 and 0 layers: its warm-up F0.0 F1.0 F0.1 F1.1
    F0.2 F1.2 F0.3 holds 6 layer-micro-batches of its 3 layers = 2 stages, and the steady state
    F2.0 after B0.3 B1.3 holds 3 + 2 + 2 chunk-micro-batches = 7 / 3 stages (equal chunks: 7 / 4)."""
    assert weighted_in_flight("interleaved_1f1b", 2, 1, 16, 4, (1 / 3, 1 / 3, 1 / 3, 0.0)) == pytest.approx(7 / 3)
    assert schedule_entry("interleaved_1f1b").in_flight(2, 1, 16, 4) == 7 / 4


def test_only_the_end_chunks_may_hold_no_layer():
    base = uniform_plan(6, pp=2, global_batch=8, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=4)
    assert base.layers_per_chunk() == (0, 1, 1, 1, 1, 1, 1, 0)
    with pytest.raises(SpecError, match=r"^chunk_layers\[1\]: must be a positive integer"):
        Plan.from_dict({**base.to_dict(), "chunk_layers": [1, 0, 1, 1, 1, 1, 1, 0]})
    zbv = uniform_plan(6, pp=2, global_batch=8, micro_batches=4, schedule="zbv", virtual_stages=2)
    with pytest.raises(SpecError, match=r"^chunk_layers\[0\]: must be a positive integer"):
        Plan.from_dict({**zbv.to_dict(), "chunk_layers": [0, 3, 3, 0]})


def test_chunk_layers_default_split_and_messages():
    """An omitted chunk_layers splits each stage evenly, its first chunk taking one more: stages
    (5, 3) on v 2 -> chunk 0 = 3, chunk 2 = 2 (stage 0), chunk 1 = 2, chunk 3 = 1 (stage 1)."""
    base = uniform_plan(8, pp=2, global_batch=8, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=2)
    plan = Plan.from_dict({**base.to_dict(), "stage_layers": [5, 3]})
    assert plan.layers_per_chunk() == (3, 2, 2, 1)
    assert Plan.from_dict({**plan.to_dict(), "chunk_layers": [3, 2, 2, 1]}) == plan  # stored as the default
    with pytest.raises(SpecError, match=r"^chunk_layers: stage 0 runs chunks \[0, 2\] of \[1, 2\] layers, "
                                        r"sum 3 != stage_layers\[0\] 5$"):
        Plan.from_dict({**plan.to_dict(), "chunk_layers": [1, 3, 2, 2]})
    with pytest.raises(SpecError, match=r"^chunk_layers: 3 chunks listed for pp\(2\) \* virtual_stages\(2\) = 4$"):
        Plan.from_dict({**plan.to_dict(), "chunk_layers": [4, 2, 2]})
    with pytest.raises(SpecError, match=r"^stage_layers: stage 1 has 1 layers for virtual_stages 2 chunks"):
        Plan.from_dict({**plan.to_dict(), "stage_layers": [7, 1]})


def test_unknown_schedule_lists_the_registered_ones():
    with pytest.raises(SpecError, match="schedule: must be one of gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv, "
                                        "dualpipev, looped_bfs; got 'zb'"):
        schedule_entry("zb")


def test_every_schedule_names_its_torch_class():
    assert {s: e.torch_class for s, e in REGISTRY.items()} == {
        Schedule.GPIPE: "ScheduleGPipe", Schedule.ONE_F_ONE_B: "Schedule1F1B",
        Schedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B", Schedule.ZB_H1: "ScheduleInterleavedZeroBubble",
        Schedule.ZBV: "ScheduleZBVZeroBubble", Schedule.DUALPIPE_V: "ScheduleDualPipeV",
        Schedule.LOOPED_BFS: "ScheduleLoopedBFS"}


def test_old_spelling_of_interleaving_upgrades():
    assert upgrade_schedule({"schedule": "1f1b", "virtual_stages": 2})["schedule"] == "interleaved_1f1b"
    assert upgrade_schedule({"virtual_stages": 4})["schedule"] == "interleaved_1f1b"  # 1f1b was the default
    assert upgrade_schedule({"schedule": "1f1b", "virtual_stages": 1}) == {"schedule": "1f1b", "virtual_stages": 1}
    assert upgrade_schedule({"schedule": "gpipe", "virtual_stages": 2})["schedule"] == "gpipe"  # still refused
    raw = {"schedule": "1f1b", "virtual_stages": 2}
    upgrade_schedule(raw)
    assert raw["schedule"] == "1f1b"  # a copy: the caller's dict is kept


def test_an_old_plan_file_loads_as_interleaved_1f1b():
    new = uniform_plan(8, pp=2, global_batch=8, micro_batches=4, schedule="interleaved_1f1b", virtual_stages=2)
    old = {**new.to_dict(), "schedule": "1f1b"}
    assert Plan.from_dict(old) == new
    assert Plan.from_dict(new.to_dict()) == new
    with pytest.raises(SpecError, match="virtual_stages 2 needs schedule interleaved_1f1b"):
        Plan.from_dict({**new.to_dict(), "schedule": "gpipe"})
