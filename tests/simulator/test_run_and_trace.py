"""The command line, the JSON record and the Perfetto trace."""
import json

import pytest

from simulator import simulate
from simulator.run import main
from specs import uniform_plan
from tests.simulator.handmade import HandCostModel, hand_cluster, tiny_model


def test_cli_prints_one_json_record(capsys):
    rc = main(["--model", "tiny-gpt", "--cluster", "dgx-a100-80g", "--tp", "2", "--pp", "2", "--micro-batch", "2",
               "--global-batch", "16", "--schedule", "gpipe", "--recompute", "full", "--zero", "2", "--json"])
    assert rc == 0
    record = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "throughput_samples_per_s", "peak_memory_gib", "oom", "bubble_fraction"):
        assert key in record
    assert len(record["peak_memory_gib_per_gpu"]) == 8
    assert record["plan"].startswith("pp2 m4")
    assert record["throughput_samples_per_s"] == pytest.approx(16 / record["iteration_time_s"])


def test_cli_reads_a_plan_file_and_writes_a_trace(tmp_path, capsys):
    plan = uniform_plan(4, tp=2, dp=2, pp=2, global_batch=8, micro_batches=4, model="tiny-gpt",
                        cluster="dgx-a100-80g")
    plan.save(tmp_path / "plan.json")
    trace = tmp_path / "trace.json"
    assert main([str(tmp_path / "plan.json"), "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "iteration time" in out and "peak memory" in out
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] in ("process_name", "thread_name")}
    assert {"GPU 0", "GPU 4", "links", "compute", "tp", "p2p"} <= names
    assert any(n.startswith("gpu_out") for n in names)


@pytest.mark.parametrize("argv, message", [
    (["--model", "tiny-gpt", "--cluster", "dgx-a100-80g", "--tp", "3"], "tp(3)*pp(1)*dp(2) != world(8)"),
    (["--model", "tiny-gpt", "--cluster", "dgx-a100-80g", "--zero", "3", "--tp", "8"], "needs dp > 1"),
    (["--model", "tiny-gpt", "--cluster", "dgx-a100-80g", "--micro-batch", "3", "--global-batch", "16"],
     "not a positive multiple"),
    (["--model", "no-such-model", "--cluster", "dgx-a100-80g"], "no-such-model"),
    (["--model", "tiny-gpt"], "give --model and --cluster"),
    (["--model", "tiny-gpt", "--cluster", "dgx-a100-80g", "--virtual-stages", "2"], "virtual_stages 2 needs pp > 1"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_trace_has_one_track_per_stream_and_link_in_full_mode(tmp_path):
    cluster = hand_cluster(4, bytes_per_s=1e6)
    plan = uniform_plan(2, dp=2, pp=2, global_batch=4, micro_batches=2)
    path = tmp_path / "t.json"
    simulate(tiny_model(2), cluster, plan, HandCostModel(cluster), full=True, trace_path=path)
    events = json.loads(path.read_text())["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {"GPU 0", "GPU 1", "GPU 2", "GPU 3", "links"}
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in spans)
    assert any(e["name"] == "F0 send" for e in spans)
