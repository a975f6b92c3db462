"""Galvatron's own cost model (hetu-galvatron 2.4.0 search engine), re-written from its documented
behaviour and source: reads its profile folder and scores any plan it can express as its engine does
(time with the overlap coefficient and its pipeline formula; memory in whole MB with the allocator reserve).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from cost_models.base import CostModel, LayerTime, MemoryBreakdown, PlanCost
from cost_models.registry import register
from cost_models.reserve import DEFAULT_ABOVE_GIB, DEFAULT_FRACTION, DEFAULT_RESERVE
from specs import (MEGATRON_RECOMPUTE, ClusterSpec, DPType, LayerSpec, LayerStrategy, ModelSpec, Plan, Schedule,
                   SequenceParallel, SpecError)
from specs.capabilities import ALL_TO_ALL_ONLY, BF16_ONLY, NO_TP_OVERLAP, OFF, Capabilities, check_supported
from specs.datasets import Dataset, data_path
from specs.errors import read_json

MB = 1024**2
BACKWARD_OVER_FORWARD = 2.0
"""Galvatron's bct_fct_coe: backward compute = 2 x forward."""
CONTEXT_MB = 1024
"""pytorch_context_mem: CUDA context charged on every stage."""
SHARD_BIAS = 0.003
"""Galvatron adds 0.003 to 1/d in every ZeRO ratio so that its prediction is not below measured."""
RESERVE_ABOVE_MB = int(DEFAULT_ABOVE_GIB) * 1024
"""Above 20 GB (max_mem // 1024 > 20) Galvatron keeps 20% of the budget for the caching allocator
(the default reserve, cost_models/reserve.py, is this rule in bytes)."""
RESERVE_FRACTION = DEFAULT_FRACTION


def allocator_reserve_mb(budget_mb: int) -> int:
    """Galvatron's reserve for PyTorch's caching allocator (DpOnModel.mem_cache)."""
    return int(budget_mb * RESERVE_FRACTION) if budget_mb // 1024 > RESERVE_ABOVE_MB // 1024 else 0


@dataclass(frozen=True)
class Tables:
    """Galvatron's profile folder in its own units (ms, MB, ms/MB)."""

    hidden: int
    seq: int
    param_mb: float
    """fp32 MB of one layer (parameter_size); model states are 4 x this."""
    act_mb: dict
    """MB per sample kept by one layer: {tp: MB, 'checkpoint': MB}."""
    other_off: dict
    other_first: dict
    other_last: dict
    """Embedding + head tables {'model_states'|'activation': {tp: MB}} for pp = 1 / first / last stage."""
    layer_fit: tuple[float, float]
    other_fit: tuple[float, float]
    """(slope, intercept): forward ms of one batch = slope * batch + intercept (fitted on t * batch)."""
    comm_coe: dict
    """ms per MB of an all-reduce: '8', '4_0' (strided), '4_1' (consecutive), ..., '1' = 0."""
    p2p_coe: dict
    overlap: float
    allreduce: dict
    all2all: dict
    """Sequence-parallel collective times {group: {bytes: ms, 'popt': (slope ms/MB, intercept)}};
    all-reduce halved to one all-gather / reduce-scatter."""


def _fit(xs, ys) -> tuple[float, float]:
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(intercept)


def _int_keys(table: dict) -> dict:
    return {int(k) if str(k).isdigit() else k: (_int_keys(v) if isinstance(v, dict) else v) for k, v in table.items()}


def _sp_table(raw: dict, op: str) -> dict:
    out: dict = {}
    for key, ms in raw.items():
        m = re.fullmatch(rf"{op}_size_(\d+)_(\d+)MB_time", key)
        if m:
            out.setdefault(int(m.group(1)), {})[int(m.group(2)) * MB] = ms / 2 if op == "allreduce" else ms
    for group in out.values():
        sizes = sorted(group)
        group["popt"] = _fit([s // MB for s in sizes], [group[s] for s in sizes])
    return out


def read_tables(folder: str | Path, world: int, hidden: int) -> Tables:
    """The files Galvatron's search engine reads for one node of ``world`` GPUs."""
    folder = Path(folder)
    pick = lambda pattern: read_json(next(iter(sorted(folder.glob(pattern))), folder / pattern))
    comp, memory = pick("computation_profiling_*.json"), _int_keys(pick("memory_profiling_*.json"))
    seq = max(int(k) for k in memory["layertype_0_sp"])
    layer = memory["layertype_0_sp"][seq]
    fits = {}
    for kind in ("0", "other"):
        pts = [(int(m.group(1)), t) for k, t in comp.items()
               if (m := re.fullmatch(rf"layertype_{kind}_bsz(\d+)_seq{seq}", k))]
        fits[kind] = _fit([b for b, _ in pts], [t * b for b, t in pts])
    bw = pick(f"allreduce_bandwidth_1nodes_{world}gpus_per_node.json")
    coe = {str(world): 1.0 / bw[f"allreduce_size_{world}_consec_1"], "1": 0.0}
    d = world // 2
    while d >= 2:
        for flag in ("0", "1"):
            coe[f"{d}_{flag}"] = 1.0 / bw[f"allreduce_size_{d}_consec_{flag}"]
        d //= 2
    p2p = {int(k.removeprefix("pp_size_")): 1.0 / v for k, v in pick(f"p2p_bandwidth_1nodes_{world}gpus_per_node.json").items()}
    sp = pick(f"sp_time_1nodes_{world}gpus_per_node.json")
    return Tables(hidden=hidden, seq=seq, param_mb=float(layer["parameter_size"]),
                  act_mb=layer["tp_activation_per_bsz_dict"], other_off=memory["other_memory_pp_off_sp"][seq],
                  other_first=memory["other_memory_pp_on_first_sp"][seq],
                  other_last=memory["other_memory_pp_on_last_sp"][seq], layer_fit=fits["0"], other_fit=fits["other"],
                  comm_coe=coe, p2p_coe=p2p, overlap=float(pick("overlap_coefficient.json")["overlap_coe"]),
                  allreduce=_sp_table(sp, "allreduce"), all2all=_sp_table(sp, "all2all"))


@dataclass(frozen=True)
class GLayer:
    """One layer's strategy as Galvatron writes it ([pp, tp, dp, {fsdp, tp, sp, cpt}])."""

    tp: int
    dp: int
    fsdp: bool
    """ZeRO-3 (dp_types_enc 1); otherwise the default dp type (ZeRO-2 here)."""
    consecutive: bool
    ulysses: bool
    """use_sp: Ulysses all-to-all sequence parallel over the tp group instead of Megatron tp."""
    checkpoint: bool


@dataclass(frozen=True)
class GPlan:
    """A plan as Galvatron's plan file holds it, plus the search context its engine scored it in."""

    pp: int
    division: tuple[int, ...]
    layers: tuple[GLayer, ...]
    global_batch: int
    chunks: int
    vtp: int
    vsp: bool
    embed_sdp: bool
    min_tp: int
    max_tp: int
    sp_search: int
    """1: Megatron tp only, 2: Ulysses only, 3: both (decides the global memory buffer)."""


def gplan_from_config(raw: dict[str, Any], world: int, context: dict[str, int] | None = None) -> GPlan:
    """A GPlan from Galvatron's plan-file dict; ``context`` (min_tp, max_tp, sp_search) defaults to the
    tightest search task that holds the plan."""
    ints = lambda key, default=0: [int(x) for x in str(raw.get(key, "")).split(",") if x.strip()] or [default] * len(tps)
    tps = [int(x) for x in str(raw["tp_sizes_enc"]).split(",")]
    pp = int(raw.get("pp_deg", 1))
    if str(raw.get("default_dp_type", "zero2")) != "zero2" or str(raw.get("pipeline_type")) != "pipedream_flush":
        raise SpecError("default_dp_type", "the galvatron cost model scores zero2 / pipedream_flush plans "
                        f"(got {raw.get('default_dp_type')} / {raw.get('pipeline_type')})")
    per_stage = world // pp
    flags, sdp, usp, ckpt = ints("tp_consecutive_flags", 1), ints("dp_types_enc"), ints("use_sp"), ints("checkpoint")
    layers = tuple(GLayer(tp=t, dp=per_stage // t, fsdp=bool(sdp[i]) and per_stage // t > 1, consecutive=bool(flags[i]),
                          ulysses=bool(usp[i]) and t > 1, checkpoint=bool(ckpt[i])) for i, t in enumerate(tps))
    vtp = int(raw.get("vtp", 1))
    tight = {"min_tp": min(tps + [vtp]), "max_tp": max(tps + [vtp]),
             "sp_search": _sp_search([g for g in layers if g.tp > 1])}
    ctx = {**tight, **(context or {})}
    division = tuple(ints("pp_division")) if raw.get("pp_division") else tuple(_even(len(tps), pp))
    return GPlan(pp=pp, division=division, layers=layers, global_batch=int(raw["global_bsz"]),
                 chunks=int(raw.get("chunks", 1)), vtp=vtp, vsp=bool(int(raw.get("vsp", 0))),
                 embed_sdp=bool(int(raw.get("embed_sdp", 0))), **ctx)


def _sp_search(tp_layers: Sequence[GLayer]) -> int:
    ulysses = {g.ulysses for g in tp_layers}
    return 3 if ulysses == {True, False} else (2 if ulysses == {True} else 1)


def _even(n: int, pp: int) -> list[int]:
    """Galvatron's pp_division_even: equal stages, the remainder on the last."""
    return [n // pp] * (pp - 1) + [n - n // pp * (pp - 1)]


def _torch_chunks(size: int, chunks: int) -> list[int]:
    """Sizes of torch.arange(size).chunk(chunks)."""
    step = -(-size // chunks)
    return [min(step, size - s) for s in range(0, size, step)] if size > 0 else []


@dataclass(frozen=True)
class Score:
    """What Galvatron's engine prints for a plan."""

    time_s: float
    """Minimized timecost: one iteration, seconds."""
    stage_memory_mb: tuple[int, ...]
    """Memory cost per stage, whole MB, allocator reserve included (as the engine prints it)."""
    reserve_mb: int

    @property
    def used_mb(self) -> tuple[int, ...]:
        return tuple(m - self.reserve_mb for m in self.stage_memory_mb)


class Engine:
    """Galvatron's time and memory formulas (search_engine/cost_model.py and dynamic_programming.py)."""

    def __init__(self, tables: Tables, world: int, layers_per_model: int) -> None:
        self.t, self.world, self.layer_num = tables, world, layers_per_model

    # -- ZeRO ratios (MemoryCostModel.initialize) ----------------------------------------------
    @staticmethod
    def zero_ratios(chunks: int):
        """(zero2, zero3) share of the 4 x params model states kept per GPU at sharding degree d.
        With chunks > 1 (async grad reduce) gradients accumulate unsharded: a larger share stays."""
        shard = lambda d: 1 / d + SHARD_BIAS
        if chunks == 1:
            return (lambda d: 7 / 8 * shard(d) + 1 / 8), shard
        return (lambda d: 6 / 8 * shard(d) + 2 / 8), (lambda d: 7 / 8 * shard(d) + 1 / 8)

    def mbsz(self, p: GPlan) -> int:
        """Micro-batch of the search task (mbsz_dict[pp])."""
        return -(-(p.global_batch // (self.world // p.pp // p.min_tp)) // p.chunks)

    def real_chunks(self, p: GPlan) -> int:
        """Chunks the engine charges: ceil(L / mbsz), L = samples per min_tp group (= p.chunks for
        the plans its strict search mode keeps)."""
        local = p.global_batch // (self.world // p.pp // p.min_tp)
        return min(max(1, math.ceil(local / self.mbsz(p))), max(1, local))

    def _layer_chunks(self, p: GPlan, g: GLayer) -> int:
        local = (p.global_batch // g.dp) // (g.tp // p.min_tp)
        chunks = max(1, math.ceil(local / self.mbsz(p)))
        most = max(1, p.global_batch // (g.tp * g.dp // p.min_tp))
        return min(chunks, most)

    # -- memory ---------------------------------------------------------------------------------
    def layer_memory_mb(self, p: GPlan, g: GLayer, stage: int) -> float:
        """Model states + activations of one layer on one GPU of ``stage`` (before rounding up)."""
        chunks = self._layer_chunks(p, g)
        micro = _torch_chunks(int(p.global_batch / g.dp / (g.tp // p.min_tp)), chunks)
        end = min(p.pp - stage, chunks)
        bsz = sum(micro[:end]) / sum(micro) * p.global_batch / g.dp
        zero2, zero3 = self.zero_ratios(chunks)
        sdp = g.tp * g.dp if g.ulysses else g.dp
        states = 4 * (self.t.param_mb if g.ulysses else self.t.param_mb / g.tp)
        if g.dp > 1:
            states *= zero3(sdp) if g.fsdp else zero2(sdp)
        if g.checkpoint:
            act = self.t.act_mb["checkpoint"] * bsz / g.tp  # Megatron-SP splits the kept input by tp
        else:
            act = self.t.act_mb[g.tp] * bsz
        return states + act

    def other_memory_mb(self, p: GPlan) -> list[int]:
        """Embedding + head + CUDA context per stage (from the search's first strategy of this pp:
        tp = min_tp, so its chunk count is the plan's), whole MB."""
        gpus, chunks = self.world // p.pp, self.real_chunks(p)
        zero2, zero3 = self.zero_ratios(chunks)
        bsz = p.global_batch * p.vtp / gpus / chunks
        model_tp = 1 if p.vsp else p.vtp
        shard = gpus if p.vsp else gpus // p.vtp
        ratio = zero3(shard) if p.embed_sdp else zero2(shard)
        out = [0.0] * p.pp
        if p.pp == 1:
            out[0] = self.t.other_off["model_states"][model_tp] * ratio + self.t.other_off["activation"][p.vtp] * bsz
        else:
            first, last = self.t.other_first, self.t.other_last
            out[0] += first["model_states"][model_tp] * ratio + first["activation"][p.vtp] * bsz * p.pp
            out[-1] += last["model_states"][model_tp] * ratio + last["activation"][p.vtp] * bsz
        return [math.ceil(v + CONTEXT_MB) for v in out]

    def global_buffer_mb(self, p: GPlan) -> int:
        """Megatron-SP's global memory buffer (one gathered activation at max_tp), not under Ulysses only."""
        if p.sp_search == 2:
            return 0
        return int(self.mbsz(p) / p.min_tp * p.max_tp * self.t.hidden * self.t.seq * 2 / MB)

    def stage_memory_mb(self, p: GPlan) -> list[int]:
        """Per stage: rounded-up layers + other + buffer (what the DP packs under the budget)."""
        other, buffer = self.other_memory_mb(p), self.global_buffer_mb(p)
        out, start = [], 0
        for stage, n in enumerate(p.division):
            layers = sum(math.ceil(self.layer_memory_mb(p, g, stage)) for g in p.layers[start:start + n])
            out.append(layers + other[stage] + buffer)
            start += n
        return out

    # -- time (TimeCostModel.gen_result, per layer, one micro-batch of bsz samples) ---------------
    def _coe(self, size: int, suffix: str = "1") -> float:
        c = self.t.comm_coe
        return c[str(size)] if str(size) in c else c[f"{size}_{suffix}"]

    def _sp_time_ms(self, table: dict, nbytes: float) -> float:
        if nbytes in table:
            return table[nbytes]
        slope, intercept = table["popt"]
        return slope * nbytes / MB + intercept

    def layer_time_s(self, g: GLayer, batch: float, pp: int, with_dp: bool = True) -> float:
        """One layer, one micro-batch of ``batch`` samples over its dp group (gen_result / layer_num)."""
        t, n = self.t, self.layer_num
        bsz = batch / g.dp
        slope, intercept = t.layer_fit
        fct = (slope * bsz / g.tp + intercept) * n  # the intercept is not divided by tp
        bct = fct * BACKWARD_OVER_FORWARD + (fct if g.checkpoint else 0.0)
        params = t.param_mb if g.ulysses else t.param_mb / g.tp
        dp_msg = 2 * (g.dp - 1) / g.dp * params * n / 2  # bf16 gradients
        gather_msg = dp_msg * 0.5  # ZeRO-3 forward all-gather, charged every micro-batch
        dp_msg = dp_msg if with_dp else 0.0
        if g.ulysses:
            dc = self._coe(g.tp * g.dp)
        elif g.tp == 1 or g.dp == 1:
            dc = self._coe(g.dp)
        else:
            dc = self.t.comm_coe[f"{g.dp}_{0 if g.consecutive else 1}"]
        tp_s = 0.0
        if g.tp > 1:
            nbytes = bsz * t.seq * t.hidden * 2
            per = self._sp_time_ms((t.all2all if g.ulysses else t.allreduce)[g.tp], nbytes)
            tp_s = 4 * n * (1.5 if g.checkpoint else 1.0) * per
        if g.dp == 1:
            result = fct + bct + tp_s
        elif g.tp == 1 or g.tp < g.tp * g.dp // 2:
            result = fct + self._overlap(dp_msg, bct, dc) + tp_s
        else:
            result = fct + bct / 2 + self._overlap(dp_msg, bct / 2, dc) + tp_s
        if g.fsdp:
            result += gather_msg * dc
        if pp > 1:
            result += pp * 2 * bsz * t.seq * t.hidden * 4 / MB / 2 * t.p2p_coe[pp]
        return result * 1e-3 / n

    def _overlap(self, msg: float, bct: float, dc: float) -> float:
        """bct_dp_overlap: overlapped part at the slowed-down rate (x overlap coefficient) plus the rest."""
        gamma = self.t.overlap
        comm, comp = msg * dc * gamma, bct * gamma
        if comm > comp:
            return comp + (msg - comp / (dc * gamma)) * dc
        if comm < comp:
            return comm + (bct - comm / gamma)
        return comp

    def other_time_s(self, p: GPlan) -> list[float]:
        """Embedding + head per stage without gradient sync (OtherTimeCostModel, no-comm result)."""
        t, mbsz = self.t, self.mbsz(p)
        gpus = self.world // p.pp
        tp_ms = 0.0
        if not p.vsp and p.vtp > 1:
            slope, intercept = t.allreduce[p.vtp]["popt"]
            tp_ms = slope * mbsz * t.seq * t.hidden * 2 / MB + intercept
        slope, intercept = t.other_fit
        fct = slope * mbsz / p.min_tp + intercept  # not divided by vtp either
        if p.vsp:
            dc, states = self._coe(gpus), (t.other_off if p.pp == 1 else t.other_last)["model_states"][1]
        else:
            dp = gpus // p.vtp
            dc = self._coe(dp) if p.vtp == 1 or dp == 1 else t.comm_coe[f"{dp}_0"]
            states = (t.other_off if p.pp == 1 else t.other_first)["model_states"][p.vtp]
        dc *= (gpus // (1 if p.vsp else p.vtp) - 1) / (gpus // (1 if p.vsp else p.vtp))
        msg = states / 4 * dc
        fwd_f, bwd_f = (0.5, 0.5) if p.embed_sdp else (0.0, 0.0)  # bwd_factor - 0.5: no gradient sync
        if p.pp == 1:
            return [1e-3 * self._other_overlap(msg * fwd_f, fct, msg * bwd_f, fct * 2, 2 * tp_ms)]
        one = 1e-3 * self._other_overlap(msg * fwd_f, fct / 2, msg * bwd_f, fct, tp_ms)
        return [one] + [0.0] * (p.pp - 2) + [one]

    def _other_overlap(self, fwd_comm, fwd_comp, bwd_comm, bwd_comp, tp_ms) -> float:
        gamma = self.t.overlap
        out = tp_ms
        for comm, comp in ((fwd_comm, fwd_comp * gamma), (bwd_comm, bwd_comp * gamma)):
            out += comm + (comp - comm) / gamma if comp > comm else comm
        return out

    def iteration_time_s(self, p: GPlan) -> float:
        """pipeline_costmodel: async p2p and gradient reduce, warm-up/cool-down overlap."""
        first, chunks = p.layers[0], self.real_chunks(p)
        micro = len(_torch_chunks(int(p.global_batch / (first.tp * first.dp // p.min_tp)), chunks)) \
            if chunks > 1 else 1
        batch = p.global_batch / micro
        with_comm, compute, start = [], [], 0
        for n in p.division:
            group = p.layers[start:start + n]
            with_comm.append(sum(self.layer_time_s(g, batch, p.pp) for g in group))
            compute.append(sum(self.layer_time_s(g, batch, p.pp, with_dp=False) for g in group))
            start += n
        compute = [c + o for c, o in zip(compute, self.other_time_s(p))]
        pp, m = p.pp, micro
        result = sum(compute) + compute[-1] * (m - 1)
        rest = sum(compute[1:])
        warm = min(pp - 1, m - 1) * compute[0]
        result = max(result, max(warm / 3, rest / 3) + max(warm * 2 / 3, rest * 2 / 3)
                     + compute[0] * max(0, m + 1 - pp))
        reduce = max(w - sum(compute[:i + 1]) for i, w in enumerate(with_comm))
        return result + max(reduce, 0.0)

    def score(self, p: GPlan, budget_mb: int) -> Score:
        reserve = allocator_reserve_mb(budget_mb)
        return Score(time_s=self.iteration_time_s(p),
                     stage_memory_mb=tuple(m + reserve for m in self.stage_memory_mb(p)), reserve_mb=reserve)


def _glayer(s: LayerStrategy) -> GLayer:
    return GLayer(tp=s.degrees.split, dp=s.dp, fsdp=s.dp_type == "zero3" and s.dp > 1, consecutive=s.tp_consecutive,
                  ulysses=False, checkpoint=s.checkpoint)


@register
class GalvatronModel(CostModel):
    """Galvatron's engine's cost model on its profile folder (LLaMA-2 7B by default).

    Scores plans as its search prints them: ``plan_cost`` time is its pipeline formula; stage memory is
    whole MB per layer plus embedding/head, CUDA context and the Megatron-SP buffer (the allocator
    reserve is the budget term ``allocator_reserve_bytes``). Every tp layer runs Megatron-SP (the
    profiles were measured so). The embedding/head follow the plan: ``vocab_zero3`` is Galvatron's
    embed_sdp, ``vocab_sp`` ulysses its vsp (Megatron-SP vocabularies it cannot score: refused by
    ``plan_cost``, infinite memory in ``vocab_cost``); the ``vocab_sp`` / ``embed_sdp`` switches turn
    vsp / embed_sdp on for every plan, which also reaches what a Plan cannot say (vsp with vocab tp 1,
    which Galvatron's engine searches).
    """

    name = "galvatron"
    rank_symmetric = True
    objective_is_plan_cost = False
    """Galvatron's pipeline formula charges (m - 1) x the last stage's time where the planners'
    sum charges (m - 1) x the slowest stage's: bounds on that sum do not bound this score."""
    capabilities = Capabilities(
        dp_type={DPType.ZERO2, DPType.ZERO3}, schedule={Schedule.ONE_F_ONE_B},
        expert_parallel={OFF}, vocab_sp={SequenceParallel.NONE, SequenceParallel.ULYSSES}, cp_comm=frozenset(),
        precision=BF16_ONLY, tp_comm_overlap=NO_TP_OVERLAP, ep_dispatcher=ALL_TO_ALL_ONLY,
        recompute=MEGATRON_RECOMPUTE)
    """What its plan files say: zero2/zero3 layers (DDP/ZeRO-1 with dp > 1 has no file), 1F1B
    (pipedream_flush) without interleaving, no expert parallelism (its engine has no such term),
    a vocabulary under tp or Ulysses (vsp), not Megatron-SP, no context parallelism (the
    Galvatron profiles read here have no ring-attention term); BF16 (its profiles are BF16); no
    TP communication overlap (its TP all-reduces sit on the critical path); no DeepEP (no expert term);
    no per-op selective checkpointing (its engine knows none)."""
    runtime_overhead_bytes = 0.0
    """The 1 GB CUDA context is in each stage's other memory, as Galvatron counts it."""

    def __init__(self, cluster: ClusterSpec, galvatron_dir: str | Path | None = None, model: str | ModelSpec = "llama2-7b",
                 vocab_sp: bool = False, embed_sdp: bool = False) -> None:
        super().__init__(cluster)
        from specs import load_model
        spec = load_model(model) if isinstance(model, (str, Path)) else model
        folder = Path(galvatron_dir) if galvatron_dir is not None else data_path(Dataset.GALVATRON_LLAMA2_7B)
        tables = read_tables(folder, cluster.world_size, spec.layers[0].hidden_size)
        self.model_spec = spec.with_seq_len(tables.seq)
        self.engine = Engine(tables, cluster.world_size, spec.num_layers)
        self.vocab_sp, self.embed_sdp = bool(vocab_sp), bool(embed_sdp)

    def allocator_reserve_bytes(self, budget_bytes: float) -> float:
        """Galvatron's own rule in whole MB (int(0.2 x budget) above 20 GB) unless another reserve is set."""
        if self.reserve != DEFAULT_RESERVE:
            return super().allocator_reserve_bytes(budget_bytes)
        return allocator_reserve_mb(int(budget_bytes // MB)) * MB

    # -- whole plans ------------------------------------------------------------------------------
    def gplan(self, plan: Plan, strict: bool = True) -> GPlan:
        """``plan`` in Galvatron's terms in the tightest search task that holds it; ``strict``: a
        SpecError for what its files cannot say (DDP/ZeRO-1 with dp > 1 beside ZeRO-2, GPipe)."""
        # the layers' dp types and GPipe vs 1F1B do not matter to the embedding/head (not strict)
        lenient = replace(self.capabilities, dp_type=None, schedule={Schedule.GPIPE, Schedule.ONE_F_ONE_B})
        check_supported(plan, self.model_spec, self.capabilities if strict else lenient, "galvatron cost model")
        layers = tuple(_glayer(s) for s in plan.layers)
        tps = [g.tp for g in layers] + [plan.vocab_tp]
        return GPlan(pp=plan.pp, division=tuple(plan.stage_layers), layers=layers, global_batch=plan.global_batch,
                     chunks=plan.micro_batches, vtp=plan.vocab_tp,
                     vsp=self.vocab_sp or plan.vocab_sp == SequenceParallel.ULYSSES,
                     embed_sdp=self.embed_sdp or plan.vocab_zero3, min_tp=min(tps), max_tp=max(tps), sp_search=1)

    def score(self, plan: Plan | GPlan, budget_bytes: float) -> Score:
        """What Galvatron's engine prints for ``plan`` at ``budget_bytes`` (memory with the reserve)."""
        p = plan if isinstance(plan, GPlan) else self.gplan(plan)
        return self.engine.score(p, int(budget_bytes // MB))

    def plan_cost(self, model: ModelSpec, plan: Plan) -> PlanCost:
        plan.validate(model, self.cluster)
        p = self.gplan(plan)
        total = self.engine.iteration_time_s(p)
        memory = tuple(MemoryBreakdown(parameters_bytes=mb * MB) for mb in self.engine.stage_memory_mb(p))
        return PlanCost(iteration_time_s=total, throughput_samples_per_s=plan.global_batch / total,
                        stage_time_s=(total,) * plan.pp, stage_tail_s=(0.0,) * plan.pp, stage_memory=memory,
                        runtime_overhead_bytes=0.0)

    # -- per layer (what planners add up; plan_cost above is the exact score) ---------------------
    def layer_time(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                   micro_batches: int, first_rank: int = 0) -> LayerTime:
        g, pp = _glayer(strategy), self.cluster.world_size // strategy.gpus
        batch = micro_batch_size * strategy.dp
        compute = self.engine.layer_time_s(g, batch, pp, with_dp=False)
        full = self.engine.layer_time_s(g, batch, pp)
        return LayerTime(forward_s=compute, backward_s=0.0, dp_comm_s=full - compute,
                         exposed_dp_comm_s=max(0.0, full - compute))

    def layer_memory(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                     in_flight: int) -> MemoryBreakdown:
        return self.layer_memory_in(layer, strategy, micro_batch_size, in_flight, max(2, in_flight))

    def layer_memory_in(self, layer: LayerSpec, strategy: LayerStrategy, micro_batch_size: int,
                        in_flight: int, micro_batches: int) -> MemoryBreakdown:
        """Whole MB as Galvatron rounds each layer; the SP buffer at this layer's tp as a temporary.
        Strategies its plan files cannot express (DDP or ZeRO-1 with dp > 1, expert parallelism)
        take infinite memory."""
        if (strategy.dp > 1 and strategy.dp_type not in ("zero2", "zero3")) or strategy.has_expert_split:
            return MemoryBreakdown(parameters_bytes=float("inf"))
        pp = self.cluster.world_size // strategy.gpus
        p = GPlan(pp=pp, division=(1,) * pp, layers=(_glayer(strategy),), global_batch=micro_batch_size * strategy.dp
                  * micro_batches, chunks=micro_batches, vtp=1, vsp=False, embed_sdp=False, min_tp=1,
                  max_tp=strategy.degrees.split, sp_search=1)
        mb = math.ceil(self.engine.layer_memory_mb(p, p.layers[0], pp - min(in_flight, pp)))
        return MemoryBreakdown(parameters_bytes=mb * MB, temporary_bytes=self.engine.global_buffer_mb(p) * MB)

    def transition_time(self, layer: LayerSpec, prev: LayerStrategy, nxt: LayerStrategy,
                        micro_batch_size: int, first_rank: int = 0) -> float:
        """0: Galvatron's DP charges re-layouts only as tie-breaks; its printed time has none."""
        return 0.0

    def collective_time(self, kind: str, nbytes: float, groups: Sequence[Sequence[int]]) -> float:
        """An all-reduce-class collective at the profiled ms/MB of the largest group (consecutive)."""
        p = len(max(groups, key=len, default=()))
        if p <= 1 or nbytes <= 0:
            return 0.0
        return nbytes / MB * self.engine._coe(p) * 1e-3

    def p2p_time(self, nbytes: float, src: int, dst: int, senders: int = 1) -> float:
        """0: Galvatron charges pipeline sends inside each layer's time (layer_time)."""
        return 0.0

    def vocab_cost(self, model: ModelSpec, plan: Plan, stage: int, world_size: int
                   ) -> tuple[LayerTime, MemoryBreakdown]:
        """Infinite memory for a Megatron-SP vocabulary, which Galvatron cannot score (as for layers)."""
        if plan.vocab_sp == SequenceParallel.MEGATRON:
            return LayerTime(forward_s=0.0, backward_s=0.0), MemoryBreakdown(parameters_bytes=float("inf"))
        p = self.gplan(plan, strict=False)  # embedding/head do not depend on the layers' dp types
        time_s = self.engine.other_time_s(p)[stage]
        memory = MemoryBreakdown(parameters_bytes=self.engine.other_memory_mb(p)[stage] * MB,
                                 temporary_bytes=self.engine.global_buffer_mb(replace(p, max_tp=p.vtp)) * MB)
        return LayerTime(forward_s=time_s, backward_s=0.0), memory
