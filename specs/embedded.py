"""Self-contained plan files: the ModelSpec and ClusterSpec a plan was made for, embedded in it as
plain JSON data and rebuilt on load, so a plan file loads in any folder and on any machine; and
reading a plan file that may be Galvatron's own format."""
from __future__ import annotations

import json
import types
from dataclasses import asdict, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from specs.cluster import ClusterSpec
from specs.errors import SpecError, load_json_with
from specs.galvatron_io import KNOWN_KEYS as GALVATRON_KEYS, plan_from_galvatron
from specs.model import ModelSpec
from specs.plan import Plan


def spec_data(spec: Any) -> dict[str, Any]:
    """A frozen spec dataclass as JSON-ready data (tuples as lists)."""
    return json.loads(json.dumps(asdict(spec)))


def _build(kind: Any, value: Any, where: str) -> Any:
    origin = get_origin(kind)
    if value is None:
        return None
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(kind) if a is not type(None)]
        return _build(options[0], value, where) if len(options) == 1 else value
    if origin is tuple:
        return tuple(_build(get_args(kind)[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if is_dataclass(kind):
        if not isinstance(value, dict):
            raise SpecError(where, f"expected an object, got {value!r}")
        hints, names = get_type_hints(kind), {f.name for f in fields(kind) if f.init}
        unknown = sorted(set(value) - names)
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}", f"not a field of {kind.__name__}")
        return kind(**{k: _build(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    return value


def model_from_data(data: Any) -> ModelSpec:
    return _build(ModelSpec, data, "model_spec")


def cluster_from_data(data: Any) -> ClusterSpec:
    return _build(ClusterSpec, data, "cluster_spec")


def with_specs(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> Plan:
    """``plan`` carrying the model and cluster it was made for."""
    return replace(plan, model_spec=spec_data(model), cluster_spec=spec_data(cluster),
                   model=plan.model or model.name, cluster=plan.cluster or cluster.name)


def plan_model(plan: Plan, override: str | None = None) -> ModelSpec:
    """The model to run ``plan`` on: ``override`` (zoo name or config path) when given, else the
    embedded spec, else the model the plan names."""
    from specs.zoo import load_model
    if override:
        return load_model(override)
    if plan.model_spec is not None:
        return model_from_data(plan.model_spec)
    if not plan.model:
        raise SpecError("model", "the plan names no model and embeds none; pass --model")
    return load_model(plan.model)


def plan_cluster(plan: Plan, override: str | None = None) -> ClusterSpec:
    """As ``plan_model``, for the cluster."""
    from specs.zoo import load_cluster
    if override:
        return load_cluster(override)
    if plan.cluster_spec is not None:
        return cluster_from_data(plan.cluster_spec)
    if not plan.cluster:
        raise SpecError("cluster", "the plan names no cluster and embeds none; pass --cluster")
    return load_cluster(plan.cluster)


def is_galvatron(raw: Any) -> bool:
    return isinstance(raw, dict) and "pp_deg" in raw and set(raw) <= GALVATRON_KEYS


def read_plan(path: str | Path, world_size: int | None = None) -> Plan:
    """A hybridpar plan file, or a Galvatron one (converted for ``world_size`` GPUs; without it,
    one line saying how to load it)."""
    def parse(raw: Any) -> Plan:
        if not is_galvatron(raw):
            return Plan.from_dict(raw)
        if world_size is None:
            raise SpecError("plan", f"{path} is a Galvatron plan file; give --cluster (its GPU count sets dp) "
                            "or convert it: python -m frameworks.export --from galvatron FILE --model NAME "
                            "--cluster NAME --out plan.json")
        return plan_from_galvatron(raw, world_size)
    return load_json_with(path, parse)


__all__ = ["cluster_from_data", "is_galvatron", "model_from_data", "plan_cluster", "plan_model", "read_plan",
           "spec_data", "with_specs"]
