"""Fuzz targets for the framework files (used by benchmarks.fuzz_inputs): Megatron-LM arguments, a
Megatron-Bridge override, a torchtitan TOML and a DeepSpeed config imported with mutations, and
mutated plans exported to each framework. An accepted import must give a runnable plan; a degree
set to a value no framework accepts must be refused."""
from __future__ import annotations

import copy
import json
import math
import random
import re
import tomllib
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from benchmarks.fuzz_mutations import Format, mutate, structural

Case = tuple[Callable[[], Any], bool, str]
MODEL, CLUSTER = "llama3-8b", "dgx-h100"
BAD_INTS = ["abc", "", "1.5", "0x2", "\u0663", "-3", "0", "99999999999999999999"]
"""Values no framework takes for a degree or a batch size (as text, as the arguments carry them)."""
GOOD_INTS = ["1", "2", "4", "8", "16"]
MEGATRON_READ = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
                 "--global-batch-size", "--num-layers", "--seq-length"]
"""Flags the Megatron import reads as positive integers."""
TITAN_READ = [("parallelism", "tensor_parallel_degree"), ("parallelism", "pipeline_parallel_degree"),
              ("training", "local_batch_size")]
"""torchtitan keys the import reads as positive integers (-1 is "auto" only for others)."""
DS_READ = ["train_micro_batch_size_per_gpu"]
"""DeepSpeed config keys the import reads as positive integers."""


@lru_cache(maxsize=1)
def _specs() -> tuple[Any, Any]:
    from specs import load_cluster, load_model
    return load_model(MODEL), load_cluster(CLUSTER)


@lru_cache(maxsize=1)
def seed_exports() -> dict[str, dict[str, str]]:
    """Each framework's files for a plan it can run (tp 2, pp 2, dp 2 on one 8-GPU node)."""
    import frameworks
    from specs import uniform_plan
    model, cluster = _specs()
    base = uniform_plan(model.num_layers, tp=2, dp=2, pp=2, global_batch=16, micro_batches=4, sp="megatron",
                        model=model.name, cluster=cluster.name)
    plans = {"megatron": replace(base, layers=tuple(replace(s, dp_type="zero1") for s in base.layers)),
             "torchtitan": replace(base, layers=tuple(replace(s, dp_type="zero2") for s in base.layers)),
             "deepspeed": replace(base, layers=tuple(replace(s, dp_type="zero1") for s in base.layers))}
    out = {}
    for target, plan in plans.items():
        plan = replace(plan, vocab_tp=2, vocab_sp="megatron")
        out[target] = dict(frameworks.get(target).export(plan, model, cluster).files)
    return out


def _accepts(target: str, files: dict[str, str]) -> Callable[[], Any]:
    """Import ``files``; a plan that validates but cannot run is garbage."""
    def run() -> Any:
        import frameworks
        from benchmarks.fuzz_inputs import plan_is_runnable
        model, cluster = _specs()
        plan = frameworks.get(target).import_(files, model, cluster)
        plan.validate(model, cluster)
        return plan if plan_is_runnable(plan, model, cluster.world_size) else "GARBAGE"
    return run


def import_megatron(s: dict, tmp: Path, rng: random.Random) -> Case:
    """Megatron-LM arguments: a read flag set to a bad or a good value, cut short, or quoted."""
    text = seed_exports()["megatron"]["megatron_args.txt"]
    kind = rng.choice(["bad", "good", "cut", "quote", "drop"])
    if kind in ("bad", "good", "drop"):
        flag = rng.choice(MEGATRON_READ)
        lines = text.splitlines()
        i = next(n for n, line in enumerate(lines) if line.startswith(flag + " "))
        if kind == "drop":
            del lines[i]
            return _accepts("megatron", {"megatron_args.txt": "\n".join(lines)}), False, f"no {flag}"
        value = rng.choice(BAD_INTS if kind == "bad" else GOOD_INTS)
        lines[i] = f"{flag} '{value}' \\"
        return _accepts("megatron", {"megatron_args.txt": "\n".join(lines)}), kind == "bad", f"{flag} {value!r}"
    at = rng.randrange(len(text))
    mutated = text[:at] if kind == "cut" else text[:at] + rng.choice(["'", '"', "\\", "#", "--"]) + text[at:]
    return _accepts("megatron", {"megatron_args.txt": mutated}), False, f"{kind} at {at}"


def import_bridge(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A Megatron-Bridge override with one line changed, dropped or broken."""
    lines = seed_exports()["megatron"]["megatron_bridge_override.yaml"].splitlines()
    i = rng.choice([n for n, line in enumerate(lines) if line.startswith("  ")])
    key = lines[i].strip().partition(":")[0]
    kind = rng.choice(["value", "no colon", "drop"])
    if kind == "drop":
        del lines[i]
        return _accepts("megatron", {"megatron_bridge_override.yaml": "\n".join(lines)}), False, f"no {key}"
    value = rng.choice(BAD_INTS + GOOD_INTS)
    lines[i] = f"  {key}: {value}" if kind == "value" else f"  {key} {value}"
    garbage = kind == "no colon" or (key.endswith(("_size", "_parallel_size")) and value in BAD_INTS)
    return _accepts("megatron", {"megatron_bridge_override.yaml": "\n".join(lines)}), garbage, f"{key} {value!r}"


def _toml_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")) if isinstance(value, float) \
            and not math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        items = [_toml_value(v) for v in value]
        return "[" + ", ".join(v for v in items if v is not None) + "]"
    if isinstance(value, dict):
        items = {k: _toml_value(v) for k, v in value.items()}
        return "{" + ", ".join(f"{json.dumps(k)} = {v}" for k, v in items.items() if v is not None) + "}"
    return None  # null: TOML has none, the key is left out


def to_toml(raw: dict) -> str:
    """``raw`` (tables of scalars, lists and inline tables) as TOML text."""
    top = _pairs({k: v for k, v in raw.items() if not isinstance(v, dict)})
    tables = [f"[{json.dumps(name)}]\n" + "\n".join(_pairs(table))
              for name, table in raw.items() if isinstance(table, dict)]
    return "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n"


def _pairs(table: dict) -> list[str]:
    texts = {k: _toml_value(v) for k, v in table.items()}
    return [f"{json.dumps(k)} = {text}" for k, text in texts.items() if text is not None]


def import_torchtitan(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A torchtitan TOML: a read key set to a bad or a good value, or a structural mutation."""
    raw = tomllib.loads(seed_exports()["torchtitan"]["torchtitan.toml"])
    kind = rng.choice(["bad", "good", "structure"])
    if kind == "structure":
        mutated, _, what = structural(raw, Format(open_at=lambda path: True), rng)
        return _accepts("torchtitan", {"torchtitan.toml": to_toml(mutated)}), False, what
    section, key = rng.choice(TITAN_READ)
    bad = {"abc": "abc", "1.5": 1.5, "0": 0, "-3": -3, "true": True, "list": [2]}
    if kind == "bad":
        label, value = rng.choice(list(bad.items()))
    else:
        label = rng.choice(GOOD_INTS)
        value = int(label)
    raw = copy.deepcopy(raw)
    raw.setdefault(section, {})[key] = value
    return _accepts("torchtitan", {"torchtitan.toml": to_toml(raw)}), kind == "bad", f"{section}.{key} {label}"


def import_deepspeed(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A DeepSpeed config with a mutation (its launcher arguments unchanged)."""
    files = dict(seed_exports()["deepspeed"])
    config = json.loads(files["ds_config.json"])
    if rng.random() < 0.5:
        key = rng.choice(DS_READ)
        value = rng.choice(["abc", 1.5, 0, -3, True, None, 2, 4])
        config[key] = value
        files["ds_config.json"] = json.dumps(config)
        # null: DeepSpeed derives the micro-batch from the batch and the accumulation steps
        garbage = value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0)
        return _accepts("deepspeed", files), garbage, f"{key} {value!r}"
    m = mutate(config, Format(open_at=lambda path: True), rng)
    files["ds_config.json"] = m.data.decode("utf-8", errors="replace")
    return _accepts("deepspeed", files), False, m.what


def export_plan(s: dict, tmp: Path, rng: random.Random) -> Case:
    """A mutated plan exported to a framework: refused in one line, or files with finite numbers."""
    import frameworks
    from specs import Plan
    seed = Plan.from_dict(json.loads(json.dumps(rng.choice(s["plans"])))).to_dict()
    m = mutate(seed, Format(), rng)
    path = tmp / "plan.json"
    path.write_bytes(m.data)
    target = rng.choice(frameworks.available())

    def run() -> Any:
        from specs import load_cluster, load_model
        plan = Plan.load(path)
        model, cluster = load_model(plan.model), load_cluster(plan.cluster)
        plan.validate(model, cluster)
        text = "".join(frameworks.get(target).export(plan, model, cluster).files.values())
        return "GARBAGE" if re.search(r"\b(nan|inf|infinity)\b", text, re.I) else text
    return run, m.garbage, f"{target}: {m.what}"


TARGETS: dict[str, Callable[[dict, Path, random.Random], Case]] = {
    "import megatron args": import_megatron, "import megatron-bridge": import_bridge,
    "import torchtitan": import_torchtitan, "import deepspeed": import_deepspeed, "export plan": export_plan,
}
