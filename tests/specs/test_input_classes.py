"""Input classes the third reliability round found: numbers that make non-finite times, Galvatron
profile folders broken in their structure, widths and counts past their limits. Each is one
SpecError line naming the field, never a traceback or a record with an infinite time."""
import json
import re
import shutil
from pathlib import Path

import pytest

import specs
from cost_models.constants import constants_for
from cost_models.profiled import from_galvatron_dir
from runners.compare import main as compare_main
from simulator.run import main as simulate_main
from specs import SpecError, load_cluster, load_model
from specs.cli import dumps
from specs.datasets import Dataset, data_path
from specs.files import atomic_write_json
from specs.profile_format import Profile

A100 = json.loads((specs.zoo.CLUSTERS_DIR / "dgx-a100-80g.json").read_text())
A100.pop("calibration")
GALVATRON = data_path(Dataset.GALVATRON_LLAMA2_7B)
PROFILE = json.loads(re.search(r"```json\n(.*?)```", (Path(specs.__file__).parents[1] / "docs" / "profile_format.md")
                               .read_text(), re.S).group(1))


def _error(call) -> SpecError:
    with pytest.raises(SpecError) as err:
        call()
    assert "\n" not in str(err.value)
    return err.value


def _cluster(tmp_path, section: str, key: str, value: float) -> Path:
    raw = {**A100, "nodes": 2, section: {**A100[section], key: value}}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("section, key, value, time", [
    ("inter_node", "nic_bandwidth_gbytes_per_s", 5e-324, "inf s"),
    ("inter_node", "latency_us", 1e308, "1e+302 s"),
    ("intra_node", "bandwidth_gbytes_per_s", 1e-300, "1e+300 s"),
    ("gpu", "peak_tflops", 5e-324, "inf s"),
    ("gpu", "memory_bandwidth_gbytes_per_s", 1e-10, "1e+10 s"),
])
def test_a_cluster_that_makes_non_finite_times_is_refused_naming_field_and_time(tmp_path, section, key, value, time):
    err = _error(lambda: load_cluster(_cluster(tmp_path, section, key, value)))
    assert err.field == f"{section}.{key}" and time in err.message


@pytest.mark.parametrize("main, argv", [
    (simulate_main, ["--model", "tiny-gpt", "--dp", "16", "--global-batch", "16"]),
    (compare_main, ["--model", "tiny-gpt", "--planners", "galvatron", "--budget-gib", "8", "--global-batch", "16",
                    "--no-progress"]),
])
def test_the_clis_say_which_cluster_number_makes_an_infinite_time(tmp_path, capsys, main, argv):
    """The planner used to crash with StopIteration, the simulator to print 'inf ms, comm nan%'."""
    path = _cluster(tmp_path, "inter_node", "nic_bandwidth_gbytes_per_s", 5e-324)
    assert main(argv + ["--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "inter_node.nic_bandwidth_gbytes_per_s" in err and "\n" not in err


@pytest.mark.parametrize("name, value", [("bus_efficiency", 5e-324), ("host_time_per_kernel_s", 1e308),
                                         ("gemm_half_efficiency_flops", 1e300)])
def test_a_calibration_that_makes_non_finite_times_is_refused(name, value):
    assert _error(lambda: constants_for({name: value})).field == f"constants.{name}"


@pytest.mark.parametrize("key, value", [("optimizer_ms_per_mparam", 1e308), ("allreduce_latency_us", 1e300)])
def test_a_profile_that_makes_non_finite_times_is_refused(key, value):
    """optimizer_ms_per_mparam 1e308 used to give a record marked feasible with no time."""
    assert _error(lambda: Profile.from_dict({**PROFILE, key: value})).field == key


def test_a_profile_built_in_code_has_its_tables_checked():
    profile = Profile.from_dict(PROFILE)
    with pytest.raises(SpecError, match="allreduce_gbytes_per_s"):
        Profile(layers=profile.layers, allreduce_gbytes_per_s={"2_consec": 0.0})


def test_json_writers_refuse_non_finite_numbers(tmp_path):
    with pytest.raises(ValueError, match=r"rows\[1\]\.time_s"):
        dumps({"rows": [{"time_s": 1.0}, {"time_s": float("inf")}]})
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "x.json", {"t": float("nan")})
    assert not list(tmp_path.iterdir())


# -- Galvatron profile folders -------------------------------------------------------------------
def _galvatron(tmp_path, pattern: str, mutate) -> Path:
    folder = tmp_path / "galvatron"
    shutil.copytree(GALVATRON, folder)
    path = next(folder.glob(pattern))
    path.write_text(json.dumps(mutate(json.loads(path.read_text()))))
    return folder


def _drop_parameter_size(raw):
    del raw["layertype_0_sp"]["2048"]["parameter_size"]
    return raw


def _shrinking(raw):
    """Runs with more layers faster than runs with fewer."""
    return {k: v / 10 if not k.startswith("layernum[2]") else v for k, v in raw.items()}


@pytest.mark.parametrize("pattern, mutate, field", [
    ("memory_profiling_*", _drop_parameter_size, "layertype_0_sp['2048'].parameter_size"),
    ("memory_profiling_*", lambda raw: {**raw, "layertype_0_sp": 5}, "layertype_0_sp"),
    ("memory_profiling_*", lambda raw: 5, "(top level)"),
    ("allreduce_bandwidth_1nodes_*", lambda raw: {k: 0 for k in raw}, "allreduce_size_8_consec_1"),
    ("p2p_bandwidth_1nodes_*", lambda raw: {k: 0 for k in raw}, "pp_size_2"),
    ("overlap_coefficient*", lambda raw: [], "(top level)"),
    ("computation_profiling_*", _shrinking, "computation_profiling.layernum[4]_bsz1"),
])
def test_a_broken_galvatron_folder_is_one_line_naming_the_key(tmp_path, pattern, mutate, field):
    folder = _galvatron(tmp_path, pattern, mutate)
    err = _error(lambda: from_galvatron_dir(folder, load_cluster("dgx-a100-80g"), load_model("llama2-7b")))
    assert err.field == field


def test_shrinking_compute_names_the_two_runs(tmp_path):
    folder = _galvatron(tmp_path, "computation_profiling_*", _shrinking)
    err = _error(lambda: from_galvatron_dir(folder, load_cluster("dgx-a100-80g"), load_model("llama2-7b")))
    assert "is not more than layernum[2]'s" in err.message and "a layer would take -" in err.message


# -- widths and counts -------------------------------------------------------------------------
_QWEN_MOE = dict(model_type="qwen2_moe", hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=128, num_hidden_layers=4, vocab_size=1000, max_position_embeddings=128,
                 seq_length=128, num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2)
_DEEPSEEK = dict(_QWEN_MOE, model_type="deepseek_v3", n_routed_experts=8, kv_lora_rank=16, q_lora_rank=0,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


@pytest.mark.parametrize("base, key, value, field", [
    (_QWEN_MOE, "moe_intermediate_size", 2**30, "moe_intermediate_size"),
    (_QWEN_MOE, "num_experts", 2**30, "num_experts"),
    (_DEEPSEEK, "n_routed_experts", 2**30, "n_routed_experts"),
    (_DEEPSEEK, "v_head_dim", 2**30, "v_head_dim"),
    (dict(_QWEN_MOE, model_type="llama"), "head_dim", 2**30, "head_dim"),
    (dict(_QWEN_MOE, model_type="mistral"), "sliding_window", 2**30, "sliding_window"),
    (_QWEN_MOE, "mlp_only_layers", [10**9, -5, "x"], "mlp_only_layers[0]"),
    (_QWEN_MOE, "mlp_only_layers", [1, "x"], "mlp_only_layers[1]"),
    (_QWEN_MOE, "mlp_only_layers", [-5], "mlp_only_layers[0]"),
])
def test_every_width_and_count_has_a_limit(tmp_path, base, key, value, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, key: value}))
    assert _error(lambda: load_model(path)).field == field


def test_the_limits_come_from_one_table():
    from specs.layer_parts import MoESpec
    from specs.limits import MAX_EXPERTS, limit_of
    assert limit_of("moe.num_experts")[0] == limit_of("n_routed_experts")[0] == MAX_EXPERTS
    err = _error(lambda: MoESpec(num_experts=MAX_EXPERTS + 1, top_k=1, expert_ffn_hidden_size=8))
    assert err.field == "moe.num_experts"


def test_a_galvatron_plan_where_a_plan_is_expected_names_the_converter():
    from specs import Plan
    path = next(GALVATRON.glob("galvatron_config_*.json"))
    err = _error(lambda: Plan.load(path))
    assert "Galvatron plan file" in err.message and "load_galvatron_plan" in err.message
