"""Fuzz targets for the input classes of the third reliability round (used by benchmarks.fuzz_inputs):
numbers that make non-finite times, Galvatron profile folders broken in their structure, widths and
counts at and past their limits, non-regular files given as inputs, a Galvatron plan given as a plan.
Each draws one case and says, from its own oracle, whether the input is garbage."""
from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path
from typing import Any, Callable

Case = tuple[Callable[[], Any], bool, str]
EXTREMES = [5e-324, 1e-300, 1e-12, 1e-7, 0.5, 3.0, 1e5, 1e7, 1e300, 1e308]
"""Values a rate or a time field is set to: the first and last few make a unit of work take
longer than specs.limits.MAX_UNIT_TIME_S (or forever)."""
UNIT_LIMIT_S = 1e6
"""The oracle's own copy of the unit-time limit (specs.limits.MAX_UNIT_TIME_S)."""
CLUSTER_RATES = [("gpu", "peak_tflops", lambda v: 1 / v), ("gpu", "memory_bandwidth_gbytes_per_s", lambda v: 1 / v),
                 ("intra_node", "bandwidth_gbytes_per_s", lambda v: 1 / v),
                 ("intra_node", "latency_us", lambda v: v * 1e-6),
                 ("inter_node", "nic_bandwidth_gbytes_per_s", lambda v: 1 / v),
                 ("inter_node", "latency_us", lambda v: v * 1e-6)]
"""(section, field, the time it gives one unit of work) of a cluster file."""


def _too_slow(seconds: float) -> bool:
    return not seconds <= UNIT_LIMIT_S  # inf and NaN too


def _write(tmp: Path, raw: Any, name: str = "input.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(raw))
    return path


def _cli(argv: list[str], main_path: str) -> Callable[[], Any]:
    from benchmarks.fuzz_inputs import _cli as run_cli
    module = __import__(main_path, fromlist=["main"])
    return lambda: run_cli(module.main, argv)


def finite_cluster(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A cluster whose numbers are finite but may make times infinite, simulated and planned."""
    raw = copy.deepcopy(rng.choice(s["clusters"]))
    raw.pop("calibration", None)
    raw["nodes"] = 2  # the network is used
    section, key, unit_s = rng.choice(CLUSTER_RATES)
    value = rng.choice(EXTREMES)
    raw.setdefault(section, {})[key] = value
    path = _write(tmp, raw)
    garbage = _too_slow(unit_s(value))
    world = raw["nodes"] * raw["gpus_per_node"]
    if rng.random() < 0.5:
        run = _cli(["--model", "tiny-gpt", "--cluster", str(path), "--dp", str(world), "--global-batch", str(world),
                    "--json"], "simulator.run")
    else:
        run = _cli(["--model", "tiny-gpt", "--cluster", str(path), "--planners", rng.choice(["ddp", "galvatron"]),
                    "--budget-gib", "8", "--global-batch", str(world), "--no-progress", "--json"], "planners.compare")
    return run, garbage, f"{section}.{key} = {value!r}"


def finite_calibration(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A calibration constant set to an extreme value."""
    from cost_models.constants import constants_for
    raw = copy.deepcopy(s["calibration"])
    name = rng.choice(sorted(raw["constants"]))
    value = rng.choice(EXTREMES)
    raw["constants"][name] = value
    efficiency = name.endswith("efficiency") or name == "dp_overlap_fraction"
    scale = {"gemm_half_efficiency_flops": 1e-15, "optimizer_bytes_per_param": 1e-6, "dp_bucket_bytes": 1e-12,
             "step_latency_factor": 1e-6, "network_step_latency_factor": 1e-6}.get(name, 1.0)
    garbage = (_too_slow(1 / value) or value > 1) if efficiency else _too_slow(value * scale)
    garbage = garbage or (name == "overlap_coefficient" and value < 1)
    if name in ("cv_error_p10", "cv_error_p90"):  # relative errors: their own rule, not a time
        garbage = not -1 < raw["constants"].get("cv_error_p10", 0.0) <= raw["constants"].get("cv_error_p90", 0.0)
    path = _write(tmp, raw)
    return (lambda: constants_for(path)), garbage, f"constants.{name} = {value!r}"


def finite_profile(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A profile time or bandwidth set to an extreme value (optimizer_ms_per_mparam 1e308 used to
    give a feasible record with no time), planned with the profiled cost model."""
    raw = copy.deepcopy(s["profile"])
    choice = rng.choice(["optimizer_ms_per_mparam", "allreduce_latency_us", "forward_ms", "allreduce_gbytes_per_s"])
    value = rng.choice(EXTREMES)
    if choice in ("optimizer_ms_per_mparam", "allreduce_latency_us"):
        raw[choice] = value
        unit_s = value * (1e-3 if choice.endswith("_ms_per_mparam") else 1e-6)
    elif choice == "forward_ms":
        table = raw["layers"][0]["forward_ms"]
        table[next(iter(table))] = value
        unit_s = value * 1e-3
    else:
        table = raw["allreduce_gbytes_per_s"]
        table[next(iter(table))] = value
        unit_s = 1 / value
    path = _write(tmp, raw)
    from specs.profile_format import load_profile
    return (lambda: load_profile(path).to_dict()), _too_slow(unit_s), f"{choice} = {value!r}"


def _galvatron_break(raw: Any, name: str, rng: random.Random) -> tuple[Any, str]:
    """One structural break of a Galvatron file's content (always garbage)."""
    kinds = ["file is a number", "file is a list", "entry is a number", "entry dropped", "zero"]
    if name.startswith("memory"):
        kinds += ["no parameter_size", "tables not objects"]
    if name.startswith("computation"):
        kinds.append("shrinking")
    kind = rng.choice(kinds)
    if kind == "file is a number":
        return 5, kind
    if kind == "file is a list":
        return [raw], kind
    raw = copy.deepcopy(raw)
    key = rng.choice(sorted(raw))
    if kind == "entry is a number" and isinstance(raw[key], dict):
        raw[key] = 7
    elif kind == "entry is a number":
        raw[key] = {"x": 1}
    elif kind == "entry dropped":
        return ({"overlap": 1.0} if name.startswith("overlap") else {}), "every entry dropped"
    elif kind == "zero":
        leaf = _first_leaf(raw)
        leaf[0][leaf[1]] = 0 if name.startswith(("allreduce", "p2p")) else -1
        kind = "a bandwidth of 0" if name.startswith(("allreduce", "p2p")) else "a negative number"
    elif kind == "no parameter_size":
        section = next(k for k in raw if k.startswith("layertype_"))
        for table in raw[section].values():
            table.pop("parameter_size", None)
    elif kind == "tables not objects":
        section = next(k for k in raw if k.startswith(("layertype_", "other_memory_")))
        raw[section] = {seq: 3 for seq in raw[section]}
    else:  # shrinking: runs with more layers take a tenth of the time of those with fewer
        low = min(k.split("]")[0] for k in raw if k.startswith("layernum["))
        raw = {k: (v if k.startswith(low) else v / 10) for k, v in raw.items()}
    return raw, kind


def _first_leaf(raw: dict) -> tuple[dict, str]:
    for key, value in raw.items():
        if isinstance(value, dict):
            return _first_leaf(value)
        return raw, key
    raise ValueError("no leaf")


def galvatron_structure(s: dict, tmp: Path, rng: random.Random) -> Case:
    from cost_models.galvatron_profile import PROFILE_FILES
    from cost_models.profiled import from_galvatron_dir
    from specs import load_cluster, load_model
    folder = tmp / "galvatron"
    folder.mkdir(exist_ok=True)
    files = sorted(p for pattern in PROFILE_FILES for p in s["galvatron_dir"].glob(pattern))
    for p in files:
        (folder / p.name).write_bytes(p.read_bytes())
    victim = rng.choice([p for p in files if not p.name.startswith("sp_time")])
    broken, what = _galvatron_break(json.loads(victim.read_text()), victim.name, rng)
    (folder / victim.name).write_text(json.dumps(broken))
    return (lambda: from_galvatron_dir(folder, load_cluster("dgx-a100-80g"), load_model("llama2-7b"))), True, \
        f"{victim.name}: {what}"


MOE_CONFIG = dict(model_type="qwen2_moe", hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                  intermediate_size=128, num_hidden_layers=4, vocab_size=1000, max_position_embeddings=128,
                  seq_length=128, num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2)
MLA_CONFIG = dict(MOE_CONFIG, model_type="deepseek_v3", n_routed_experts=8, kv_lora_rank=16, q_lora_rank=0,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
WIDTHS = {"moe_intermediate_size": 1 << 24, "v_head_dim": 1 << 24, "qk_nope_head_dim": 1 << 24,
          "kv_lora_rank": 1 << 24, "head_dim": 1 << 24, "sliding_window": 1 << 24, "num_experts": 1 << 16,
          "n_routed_experts": 1 << 16, "intermediate_size": 1 << 24, "vocab_size": 1 << 24}
"""The oracle's limits (written apart from specs.limits)."""


def width_fields(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A Hugging Face config with one width or count at, past or far past its limit, or a junk
    mlp_only_layers; the model is built and its parameters counted."""
    from specs import load_model
    if rng.random() < 0.25:
        junk = rng.choice([[10**9], [-5], ["x"], [1.5], [True], [3], [0, 2], [4], "all", [[1]]])
        raw, what = dict(MOE_CONFIG, mlp_only_layers=junk), f"mlp_only_layers = {junk!r}"
        garbage = not (isinstance(junk, list) and all(type(i) is int and 0 <= i < 4 for i in junk))
    else:
        key = rng.choice(sorted(WIDTHS))
        base = MLA_CONFIG if key in ("v_head_dim", "qk_nope_head_dim", "kv_lora_rank", "n_routed_experts") else \
            dict(MOE_CONFIG, model_type="mistral") if key == "sliding_window" else \
            dict(MOE_CONFIG, model_type="llama") if key == "head_dim" else MOE_CONFIG
        value = rng.choice([WIDTHS[key], WIDTHS[key] + 1, 1 << 30, 10**18, 8])
        raw, what, garbage = dict(base, **{key: value}), f"{key} = {value}", value > WIDTHS[key]
    path = _write(tmp, raw, "config.json")
    return (lambda: load_model(path).param_count()), garbage, what


def non_regular_file(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A FIFO (with no writer: reading it would block forever), a device or a folder given as
    any input file."""
    from cost_models.constants import constants_for
    from specs import Plan, load_cluster, load_model
    from specs.profile_format import load_profile
    kind = rng.choice(["fifo", "/dev/zero", "/dev/null", "folder"])
    path = tmp / "input.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path(kind)
    reader = rng.choice([("load_model", load_model), ("load_cluster", load_cluster), ("Plan.load", Plan.load),
                         ("load_profile", load_profile), ("calibration", constants_for)])
    if rng.random() < 0.3:
        run = _cli(["--model", "tiny-gpt", "--cluster", str(path), "--json"], "simulator.run")
        return run, True, f"simulator.run --cluster {kind}"
    return (lambda: reader[1](path)), True, f"{reader[0]}({kind})"


def galvatron_as_plan(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A Galvatron plan file (maybe mutated) where a hybridpar plan is expected: an error that
    says so (a message without 'Galvatron' counts as a traceback)."""
    from benchmarks.fuzz_mutations import Format, structural
    from specs import Plan, SpecError
    whole = rng.random() < 0.5
    raw = s["galvatron_plan"] if whole else structural(s["galvatron_plan"], Format(), rng)[0]
    path = _write(tmp, raw)

    def run() -> Any:
        try:
            return Plan.load(path)
        except SpecError as err:  # a mutant may be refused by the reader first (a 31-digit integer)
            if whole and "Galvatron" not in err.message:
                raise RuntimeError(f"not named as a Galvatron file: {err}") from None
            raise
    return run, True, "galvatron plan as a plan"


TARGETS: dict[str, Callable[[dict, Path, random.Random], Case]] = {
    "finite: cluster": finite_cluster, "finite: calibration": finite_calibration,
    "finite: profile": finite_profile, "galvatron structure": galvatron_structure,
    "width fields": width_fields, "non-regular file": non_regular_file, "galvatron as plan": galvatron_as_plan,
}
