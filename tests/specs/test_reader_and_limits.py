"""The one reader and the stated limits: every case the reliability attack found gives one
SpecError line naming the field, before any work starts."""
import json
import os

import pytest

import specs
from cost_models.constants import constants_for
from simulator.run import main as simulate_main
from specs import Plan, SpecError, load_cluster, load_model, uniform_plan
from specs.limits import MAX_LAYERS, MAX_MICRO_BATCHES, MAX_NODES
from specs.reader import read_json_file

T5 = json.loads((specs.zoo.MODELS_DIR / "t5-large-48.json").read_text())
CLUSTER = json.loads((specs.zoo.CLUSTERS_DIR / "titan-8.json").read_text())
CALIBRATION = json.loads((specs.zoo.ZOO_DIR / "calibration" / "a100.json").read_text())
PLAN = uniform_plan(4, tp=2, dp=2, global_batch=8, micro_batches=2, model="tiny-gpt", cluster="cpu-4").to_dict()


def _write(tmp_path, content: bytes | str | dict, name: str = "f.json"):
    path = tmp_path / name
    data = json.dumps(content) if isinstance(content, dict) else content
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _error(call) -> SpecError:
    with pytest.raises(SpecError) as err:
        call()
    assert "\n" not in str(err.value)
    return err.value


@pytest.mark.parametrize("data, field, text", [
    (json.dumps(CLUSTER).encode("utf-16"), "(encoding)", "UTF-16"),
    (json.dumps(CLUSTER).encode("utf-16-le"), "(encoding)", "UTF-16"),
    (b'{"name": "\xe9"}', "(encoding)", "not UTF-8"),
    (b"[" * 900 + b"]" * 900, "[0]" * 32, "nested deeper than the limit"),
    (b'{"a": {"b": [1, ' + b"[" * 40 + b"]" * 40 + b"]}}", "a.b[1]" + "[0]" * 29, "nested deeper than the limit"),
    (b"\x00" * 64, "(encoding)", "a NUL byte at offset 0"),
    (b"\xff\xfe{}", "(encoding)", "UTF-16 byte-order mark"),
    (b'{"nodes": ' + b"9" * 5000 + b"}", "nodes", "5000 digits"),
    (b'{"gpu": {"memory_gib": NaN}}', "gpu.memory_gib", "NaN is not a finite number"),
    (b'{"layers": [1, -Infinity]}', "layers[1]", "-Infinity is not a finite number"),
    (b'{"nodes": 1e999}', "nodes", "too large to be finite"),
    (b'{"nodes": 1, "nodes": 2}', "nodes", "duplicate key"),
    (b'{"nodes": ', "(json)", "line 1"),
])
def test_the_reader_refuses_broken_files_in_one_line(tmp_path, data, field, text):
    path = _write(tmp_path, data)
    err = _error(lambda: read_json_file(path))
    assert err.field == field and text in err.message and err.source == str(path)


@pytest.mark.parametrize("make, kind", [(lambda p: os.mkfifo(p), "a FIFO"), (lambda p: p.mkdir(), "a folder")])
def test_the_reader_refuses_non_regular_files_without_blocking(tmp_path, make, kind):
    path = tmp_path / "input.json"
    make(path)
    err = _error(lambda: read_json_file(path))  # a FIFO with no writer used to block here forever
    assert err.field == "(file)" and kind in err.message


def test_a_device_is_not_read(tmp_path):
    assert "character device" in _error(lambda: read_json_file("/dev/zero")).message


def test_a_utf8_bom_is_fine(tmp_path):
    assert read_json_file(_write(tmp_path, b"\xef\xbb\xbf" + json.dumps(CLUSTER).encode())) == CLUSTER


@pytest.mark.parametrize("key, value", [("num_layers", 10**12), ("num_layers", 10**29), ("num_decoder_layers", 10**12)])
def test_t5_with_absurd_layer_counts_fails_fast(tmp_path, key, value):
    err = _error(lambda: load_model(_write(tmp_path, {**T5, key: value})))
    assert err.field == key and f"{MAX_LAYERS}" in err.message.replace(",", "")


def test_layer_total_limit_is_a_cross_field_rule(tmp_path):
    err = _error(lambda: load_model(_write(tmp_path, {**T5, "num_layers": 6000, "num_decoder_layers": 6000})))
    assert err.field == "layers" and "12,000" in err.message


def test_a_million_nodes_fails_fast():
    err = _error(lambda: load_cluster("dgx-a100-80g:1000000"))
    assert err.field == "nodes" and f"{MAX_NODES:,}" in err.message


@pytest.mark.parametrize("count", ["\u0663", "", "-1", "0", "2x"])
def test_node_counts_are_ascii_positive_integers(count):
    assert _error(lambda: load_cluster(f"cpu-4:{count}")).field == "cluster"


def test_a_hundred_thousand_micro_batches_fail_fast(capsys):
    rc = simulate_main(["--model", "tiny-gpt", "--cluster", "cpu-4", "--dp", "4", "--micro-batch", "1",
                        "--global-batch", "400000"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: micro_batches:") and f"{MAX_MICRO_BATCHES:,}" in err


@pytest.mark.parametrize("mutate, field", [
    (lambda c: c["intra_node"].update(gpus_per_switch=-1), "intra_node.gpus_per_switch"),
    (lambda c: c["gpu"].update(memory_gib=True), "gpu.memory_gib"),
    (lambda c: c.update(gpus_per_node=False), "gpus_per_node"),
])
def test_cluster_garbage_that_was_accepted_is_refused(tmp_path, mutate, field):
    raw = json.loads(json.dumps(CLUSTER))
    mutate(raw)
    assert _error(lambda: load_cluster(_write(tmp_path, raw))).field == field


@pytest.mark.parametrize("change, field", [({"version": True}, "version"), ({"model": 123}, "model"),
                                           ({"micro_batches": 100_000}, "micro_batches"),
                                           ({"global_batch": 8.0}, "global_batch")])
def test_plan_garbage_is_refused(tmp_path, change, field):
    assert _error(lambda: Plan.load(_write(tmp_path, {**PLAN, **change}))).field == field


@pytest.mark.parametrize("value", ["abc", True, -1.0, None])
def test_calibration_constants_must_be_numbers(tmp_path, value):
    raw = {**CALIBRATION, "constants": {**CALIBRATION["constants"], "bus_efficiency": value}}
    assert _error(lambda: constants_for(_write(tmp_path, raw))).field == "constants.bus_efficiency"


def test_a_calibration_constant_true_no_longer_doubles_anything():
    with pytest.raises(SpecError, match="constants.step_latency_factor"):
        constants_for({"step_latency_factor": True})


@pytest.mark.parametrize("trace, text", [("/nonexistent-folder/t.json", "does not exist"),
                                         ("/dev/null/t.json", "is not a folder")])
def test_output_paths_are_checked_before_the_work(capsys, trace, text):
    rc = simulate_main(["--model", "tiny-gpt", "--cluster", "cpu-4", "--trace", trace])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: --trace:") and text in err


def test_the_schemas_closed_sets_match_the_dataclasses_enums():
    # the schema spells the names out (it is read before the dataclasses exist); they must agree
    from typing import get_args

    from specs.cluster import INTRA_KINDS
    from specs.plan import DP_TYPES, SCHEDULES
    from specs.schema import IntraNodeFile, PlanFile, StrategyFile
    assert set(get_args(StrategyFile.model_fields["dp_type"].annotation)) == {str(t) for t in DP_TYPES}
    assert set(get_args(PlanFile.model_fields["schedule"].annotation)) == {str(s) for s in SCHEDULES}
    assert set(get_args(IntraNodeFile.model_fields["kind"].annotation)) == set(INTRA_KINDS)
