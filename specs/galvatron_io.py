"""Import and export Galvatron's own plan files (flat JSON, comma-separated per-layer fields)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specs.errors import SpecError, load_json_with
from specs.files import atomic_write_json
from specs.plan import DPType, LayerStrategy, Plan, even_stage_layers

_SCHEDULE_FROM = {"gpipe": "gpipe", "pipedream_flush": "1f1b"}
_SCHEDULE_TO = {"gpipe": "gpipe", "1f1b": "pipedream_flush"}


def _ints(raw: dict, key: str, n: int | None = None, default: int | None = None) -> list[int]:
    value = raw.get(key)
    if value is None:
        if default is None or n is None:
            raise SpecError(key, "missing")
        return [default] * n
    try:
        items = [int(x) for x in str(value).split(",") if x.strip() != ""]
    except ValueError:
        raise SpecError(key, f"expected comma-separated integers, got {value!r}") from None
    if n is not None and len(items) != n:
        raise SpecError(key, f"{len(items)} entries for {n} layers")
    return items


def plan_from_galvatron(raw: dict[str, Any], world_size: int) -> Plan:
    """A Plan from Galvatron's plan dict; dp = world / (pp * tp) for each layer."""
    if not isinstance(raw, dict):
        raise SpecError("(top level)", "expected a JSON object")
    pp = int(raw.get("pp_deg", 1))
    tps = _ints(raw, "tp_sizes_enc")
    n = len(tps)
    division = _ints(raw, "pp_division", pp) if "pp_division" in raw else list(even_stage_layers(n, pp))
    consec = _ints(raw, "tp_consecutive_flags", n, default=1)
    sdp = _ints(raw, "dp_types_enc", n, default=0)
    ckpt = _ints(raw, "checkpoint", n, default=0)
    if any(_ints(raw, "use_sp", n, default=0)):
        raise SpecError("use_sp", "Ulysses sequence parallelism is not in hybridpar's search space yet")
    default_dp = str(raw.get("default_dp_type", DPType.DDP))
    if default_dp not in (DPType.DDP, DPType.ZERO2):
        raise SpecError("default_dp_type", f"must be ddp or zero2, got {default_dp!r}")
    per_stage = world_size // pp
    layers = []
    for i, tp in enumerate(tps):
        if tp <= 0 or per_stage % tp:
            raise SpecError("tp_sizes_enc", f"layer {i}: tp({tp}) does not divide {per_stage} GPUs per stage")
        dp = per_stage // tp
        dp_type = DPType.DDP if dp == 1 else (DPType.ZERO3 if sdp[i] else default_dp)
        layers.append(LayerStrategy(tp=tp, dp=dp, dp_type=dp_type, tp_consecutive=bool(consec[i]),
                                    checkpoint=bool(ckpt[i])))
    schedule = _SCHEDULE_FROM.get(str(raw.get("pipeline_type", "pipedream_flush")))
    if schedule is None:
        raise SpecError("pipeline_type", f"must be gpipe or pipedream_flush, got {raw.get('pipeline_type')!r}")
    return Plan(pp=pp, stage_layers=tuple(division), layers=tuple(layers),
                global_batch=int(raw.get("global_bsz", 0)), micro_batches=int(raw.get("chunks", 1)),
                schedule=schedule, vocab_tp=int(raw.get("vtp", 1)))


def plan_to_galvatron(plan: Plan) -> dict[str, Any]:
    """Galvatron's plan dict for ``plan`` (ZeRO-2 layers set default_dp_type zero2)."""
    types = {s.dp_type for s in plan.layers if s.dp > 1}
    if DPType.ZERO1 in types or (DPType.ZERO2 in types and DPType.DDP in types):
        raise SpecError("dp_type", f"Galvatron files express one default dp type besides zero3; plan mixes {sorted(types)}")
    join = lambda xs: ",".join(str(int(x)) for x in xs)  # noqa: E731
    return {
        "pp_deg": plan.pp,
        "tp_sizes_enc": join(s.tp for s in plan.layers),
        "tp_consecutive_flags": join(s.tp_consecutive for s in plan.layers),
        "dp_types_enc": join(s.dp_type == DPType.ZERO3 for s in plan.layers),
        "use_sp": join(0 for _ in plan.layers),
        "checkpoint": join(s.checkpoint for s in plan.layers),
        "global_bsz": plan.global_batch,
        "chunks": plan.micro_batches,
        "pp_division": join(plan.stage_layers),
        "pipeline_type": _SCHEDULE_TO[plan.schedule],
        "default_dp_type": DPType.ZERO2 if DPType.ZERO2 in types else DPType.DDP,
        "vtp": plan.vocab_tp,
        "vsp": 0,
        "embed_sdp": 0,
    }


def load_galvatron_plan(path: str | Path, world_size: int) -> Plan:
    return load_json_with(path, lambda raw: plan_from_galvatron(raw, world_size))


def save_galvatron_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as a Galvatron strategy file, atomically."""
    atomic_write_json(path, plan_to_galvatron(plan), indent=4)
