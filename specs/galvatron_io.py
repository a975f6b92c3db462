"""Import and export Galvatron's own plan files (flat JSON, comma-separated per-layer fields)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specs.axes import CPComm, CPLoadBalance
from specs.errors import SpecError, load_json_with
from specs.files import atomic_write_json
from specs.plan import DPType, LayerStrategy, Plan, Recompute, SequenceParallel, even_stage_layers
from specs.schema import GalvatronPlanFile, check

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


KNOWN_KEYS = frozenset({"pp_deg", "tp_sizes_enc", "tp_consecutive_flags", "dp_types_enc", "use_sp", "sp_sizes_enc",
                        "checkpoint", "global_bsz", "chunks", "pp_division", "pipeline_type", "default_dp_type",
                        "vtp", "vsp", "embed_sdp", "cp_sizes_enc", "vcp"})
"""Every key Galvatron(-2) writes that means something here; any other key is refused."""


def plan_from_galvatron(raw: dict[str, Any], world_size: int) -> Plan:
    """A Plan from Galvatron's plan dict; dp = world / (pp * degree) for each layer.

    use_sp = 1 makes the layer's group Ulysses sequence parallel, of degree sp_sizes_enc
    (Galvatron-2) or tp_sizes_enc (older files); vtp/vsp/embed_sdp set the vocabulary's tp
    degree, Ulysses flag and ZeRO-3 flag. cp_sizes_enc (Galvatron-2; absent: all 1) is each
    layer's context-parallel degree, run as Galvatron runs it: zigzag ring attention (cp_comm
    p2p), inside Ulysses' all-to-alls where use_sp is set (a2a+p2p); dp = world / (pp * degree *
    cp). vcp, the vocabulary's cp degree, has no field in a Plan: only 1 is read. Keys without a
    meaning here are refused, never dropped.
    """
    if not isinstance(raw, dict):
        raise SpecError("(top level)", "expected a JSON object")
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise SpecError(unknown[0], f"Galvatron key {unknown[0]!r} has no meaning in hybridpar; refusing the file")
    check(GalvatronPlanFile, raw)
    pp = int(raw.get("pp_deg", 1))
    tps = _ints(raw, "tp_sizes_enc")
    n = len(tps)
    division = _ints(raw, "pp_division", pp) if "pp_division" in raw else list(even_stage_layers(n, pp))
    consec = _ints(raw, "tp_consecutive_flags", n, default=1)
    sdp = _ints(raw, "dp_types_enc", n, default=0)
    ckpt = _flags(raw, "checkpoint", n)
    use_sp = _flags(raw, "use_sp", n)
    sps = _ints(raw, "sp_sizes_enc", n, default=1)
    cps = _ints(raw, "cp_sizes_enc", n, default=1)
    bad = [(i, c) for i, c in enumerate(cps) if c < 1]
    if bad:
        raise SpecError("cp_sizes_enc", f"layer {bad[0][0]}: cp {bad[0][1]} is not a positive integer")
    if raw.get("vcp", 1) != 1:
        raise SpecError("vcp", f"vocabulary cp {raw['vcp']!r} has no field in hybridpar plans (only 1 is read)")
    default_dp = str(raw.get("default_dp_type", "ddp"))
    if default_dp not in ("ddp", "zero2"):
        raise SpecError("default_dp_type", f"must be ddp or zero2, got {default_dp!r}")
    per_stage = world_size // pp
    layers = [_layer(i, tps[i], sps[i], cps[i], use_sp[i], per_stage, bool(sdp[i]), default_dp, bool(consec[i]),
                     ckpt[i]) for i in range(n)]
    schedule = _SCHEDULE_FROM.get(str(raw.get("pipeline_type", "pipedream_flush")))
    if schedule is None:
        raise SpecError("pipeline_type", f"must be gpipe or pipedream_flush, got {raw.get('pipeline_type')!r}")
    vsp = _flag(raw, "vsp")
    return Plan(pp=pp, stage_layers=tuple(division), layers=tuple(layers),
                global_batch=int(raw.get("global_bsz", 0)), micro_batches=int(raw.get("chunks", 1)),
                schedule=schedule, vocab_tp=int(raw.get("vtp", 1)), vocab_zero3=bool(_flag(raw, "embed_sdp")),
                vocab_sp=SequenceParallel.ULYSSES if vsp else SequenceParallel.NONE)


def _layer(i: int, tp: int, sp: int, cp: int, use_sp: int, per_stage: int, sdp: bool, default_dp: str,
           consecutive: bool, ckpt: int) -> LayerStrategy:
    if use_sp and tp > 1 and sp > 1:
        raise SpecError("sp_sizes_enc", f"layer {i}: tp {tp} combined with ulysses {sp} has no meaning in hybridpar")
    if not use_sp and sp > 1:
        raise SpecError("sp_sizes_enc", f"layer {i}: sp size {sp} without use_sp 1")
    degree = sp if use_sp and sp > 1 else tp
    if degree <= 0 or per_stage % degree:
        raise SpecError("tp_sizes_enc", f"layer {i}: tp({degree}) does not divide {per_stage} GPUs per stage")
    if per_stage % (degree * cp):
        raise SpecError("cp_sizes_enc", f"layer {i}: tp({degree}) * cp({cp}) does not divide {per_stage} GPUs per stage")
    dp = per_stage // (degree * cp)
    tp, ulysses = (1, degree) if use_sp else (degree, 1)
    sharded = dp * ulysses * cp > 1  # Ulysses and cp shard states over dp * ulysses * cp
    dp_type = ("zero3" if sdp else default_dp) if sharded else "ddp"
    return LayerStrategy(tp=tp, ulysses=ulysses, dp=dp, cp=cp, cp_comm=_cp_comm(cp, ulysses), dp_type=dp_type,
                         tp_consecutive=consecutive,
                         recompute=Recompute.FULL if ckpt else Recompute.NONE,
                         sp=SequenceParallel.ULYSSES if use_sp else SequenceParallel.NONE)


def _cp_comm(cp: int, ulysses: int) -> CPComm:
    """How Galvatron runs a layer's cp: a zigzag ring (p2p), inside Ulysses' all-to-alls beside it."""
    return CPComm.A2A_P2P if cp > 1 and ulysses > 1 else CPComm.P2P


def plan_to_galvatron(plan: Plan) -> dict[str, Any]:
    """Galvatron's plan dict for ``plan`` (ZeRO-2 layers set default_dp_type zero2); what a
    Galvatron file cannot say (ZeRO-1, Megatron-SP, selective recompute, interleaving, a cp
    exchange or token order other than Galvatron's zigzag ring) is refused."""
    types = {s.dp_type for s in plan.layers if s.degrees.grad_sync > 1}
    if DPType.ZERO1 in types or (DPType.ZERO2 in types and DPType.DDP in types):
        raise SpecError("dp_type", f"Galvatron files express one default dp type besides zero3; plan mixes {sorted(types)}")
    for i, s in enumerate(plan.layers):
        if s.megatron_sp:
            raise SpecError(f"layer {i}", "sp megatron has no field in Galvatron files")
        if s.recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP):
            raise SpecError(f"layer {i}", f"recompute {s.recompute} has no field in Galvatron files")
        galvatron_comm = _cp_comm(s.cp, s.ulysses)
        if s.cp_comm != galvatron_comm:
            raise SpecError(f"layer {i}", f"cp_comm {s.cp_comm} (cp {s.cp}, ulysses {s.ulysses}) has no field in "
                            f"Galvatron files (its cp is a zigzag ring: {galvatron_comm} here)")
        if s.has_expert_split:
            raise SpecError(f"layer {i}", f"{s.short()}: expert parallelism has no field in Galvatron's "
                            "dense plan files")
        if s.precision.is_fp8:
            raise SpecError(f"layer {i}", f"precision {s.precision} has no field in Galvatron files (BF16 only)")
    if plan.schedule not in _SCHEDULE_TO:
        raise SpecError("schedule", f"{plan.schedule} (virtual_stages {plan.virtual_stages}) has no field in "
                        "Galvatron files")
    if plan.cp_load_balance != CPLoadBalance.ZIGZAG:
        raise SpecError("cp_load_balance", f"cp_load_balance {plan.cp_load_balance} has no field in Galvatron files "
                        "(its runtime cp_mode, zigzag by default, is not in the plan file)")
    if plan.vocab_sp == SequenceParallel.MEGATRON:
        raise SpecError("vocab_sp", "vocab_sp megatron has no field in Galvatron files (vsp is Ulysses)")
    join = lambda xs: ",".join(str(int(x)) for x in xs)  # noqa: E731
    return {
        "pp_deg": plan.pp,
        "tp_sizes_enc": join(s.tp for s in plan.layers),
        "tp_consecutive_flags": join(s.tp_consecutive for s in plan.layers),
        "dp_types_enc": join(s.dp_type == DPType.ZERO3 for s in plan.layers),
        "use_sp": join(s.sp == SequenceParallel.ULYSSES for s in plan.layers),
        "sp_sizes_enc": join(s.ulysses for s in plan.layers),
        "cp_sizes_enc": join(s.cp for s in plan.layers),
        "checkpoint": join(s.checkpoint for s in plan.layers),
        "global_bsz": plan.global_batch,
        "chunks": plan.micro_batches,
        "pp_division": join(plan.stage_layers),
        "pipeline_type": _SCHEDULE_TO[plan.schedule],
        "default_dp_type": DPType.ZERO2 if DPType.ZERO2 in types else DPType.DDP,
        "vtp": plan.vocab_tp,
        "vsp": int(plan.vocab_sp == SequenceParallel.ULYSSES),
        "embed_sdp": int(plan.vocab_zero3),
    }


def _flags(raw: dict, key: str, n: int) -> list[int]:
    values = _ints(raw, key, n, default=0)
    bad = [v for v in values if v not in (0, 1)]
    if bad:
        raise SpecError(key, f"entries must be 0 or 1, got {bad[0]}")
    return values


def _flag(raw: dict, key: str) -> int:
    value = raw.get(key, 0)
    if value not in (0, 1, True, False):
        raise SpecError(key, f"must be 0 or 1, got {value!r}")
    return int(value)


def load_galvatron_plan(path: str | Path, world_size: int) -> Plan:
    return load_json_with(path, lambda raw: plan_from_galvatron(raw, world_size))


def save_galvatron_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as a Galvatron strategy file, atomically."""
    atomic_write_json(path, plan_to_galvatron(plan), indent=4)
