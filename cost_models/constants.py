"""Named constants of the analytical cost model, their public-figure defaults, and the cluster
calibration file (format "hybridpar-calibration") that overrides the fitted ones.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from specs import SpecError
from specs.errors import read_json
from specs.files import atomic_write_json
from specs.limits import unit_time
from specs.schema import CalibrationFile, check
from specs.units import MIB

CALIBRATION_FORMAT = "hybridpar-calibration"
CALIBRATION_VERSION = 1
SIGNED = ("cv_error_p10", "cv_error_p90")
"""Constants that may be negative (relative errors)."""


@dataclass(frozen=True, kw_only=True)
class AnalyticalConstants:
    """Efficiencies and overheads; every field has a unit and a source."""

    gemm_efficiency_max: float = 0.8
    """Fraction of peak FLOP/s a large fp16 GEMM reaches. A100: cuBLAS reaches about 250 of
    312 TFLOP/s on large GEMMs (NVIDIA matmul performance guide)."""
    fp8_gemm_efficiency_max: float = 0.7
    """Fraction of the FP8 peak (gpu.peak_fp8_tflops) a large FP8 GEMM reaches: a stated default,
    fitted on nothing. On an H100 SXM an 8192-cubed E4M3 GEMM reaches about 1,610 of 1,979
    TFLOP/s through cuBLASLt and 1,170 through torch._scaled_mm (a public cross-check report of
    cuBLASLt FP8 GEMMs): 0.81 and 0.59; 0.7 sits between the two. h100.json fits it on NeMo's
    FP8 DGX-H100 runs (python -m cost_models.calibrate --cluster dgx-h100)."""
    gemm_half_efficiency_flops: float = 1.0e9
    """FLOPs of a GEMM that reaches half of gemm_efficiency_max (small GEMMs pay launch and
    tail-wave cost): 1 GFLOP at ~230 TFLOP/s is ~4 us, the usual fixed cost of a kernel."""
    memory_efficiency: float = 0.8
    """Fraction of HBM bandwidth memory-bound kernels reach (STREAM-like copies on A100/H100
    reach 80-90% of the data-sheet figure)."""
    kernel_overhead_s: float = 2.0e-6
    """GPU-side fixed cost of each memory-bound kernel (ramp-up, tail, gap to the next),
    seconds: a few microseconds on A100/H100."""
    host_time_per_kernel_s: float = 3.0e-5
    """Host (CPU) time the framework needs to issue one kernel of ops.py's list, seconds.
    Kernels run asynchronously, so a layer pass takes max(GPU time, kernels x this): small
    layers are launch-bound. PyTorch eager costs ~10 us per operator (dispatcher + launch),
    and a Megatron block runs ~3 operators (casts, views, bias adds, RNG) per listed kernel."""
    micro_batch_overhead_s: float = 1.0e-3
    """Per micro-batch and stage framework cost (schedule bookkeeping, p2p handshakes), s."""
    iteration_overhead_s: float = 1.0e-3
    """Per iteration framework cost (loss scaling checks, zeroing buffers, logging), s."""
    optimizer_bytes_per_param: float = 32.0
    """Device-memory traffic of one mixed-precision Adam step per parameter, bytes: read fp32
    master, momentum, variance and the gradient (14-16), write the three fp32 states and the
    16-bit copy (14), plus the gradient-norm / overflow check pass (2)."""
    collective_base_latency_s: float = 20.0e-6
    """Fixed cost of launching one NCCL collective, s (1 MiB all-reduce on 2 A100 takes
    44 us, formulas.md)."""
    step_latency_factor: float = 1.0
    """Multiplier of the cluster's intra-node link latency (ClusterSpec latency_us) per ring step."""
    network_step_latency_factor: float = 1.0
    """The same for steps that cross nodes. Not fitted: the nccl-tests tables are one node."""
    bus_efficiency: float = 0.76
    """Achieved fraction of the per-GPU link bandwidth in ring collectives inside a node:
    8 x A100 all-reduce busbw 229 GB/s over 300 GB/s NVLink (formulas.md)."""
    network_efficiency: float = 0.96
    """The same across nodes: DGX-A100 inter-node all-reduce busbw ~192 GB/s over 8 x 25 GB/s
    HDR InfiniBand (formulas.md)."""
    at_scale_efficiency: float = 1.0
    """Achieved fraction of the modelled bandwidth in collectives over groups of more than
    at_scale_ranks ranks (1: as modelled). No data says otherwise, so 1; the robust objective's
    at-scale scenario lowers it (cost_models/scenarios.py)."""
    at_scale_ranks: float = 128
    """The largest collective group the measured runs in data/ cover: data-parallel (ZeRO-3 over
    128 H100 in torchtitan's 8B run, dp 128 in Llama 3 405B on 16k GPUs); groups above it are at scale."""
    p2p_efficiency: float = 0.55
    """Achieved fraction of the link in one send/recv: Galvatron's measured 164 GB/s pipeline
    p2p on A100 NVLink (300 GB/s per direction)."""
    dp_overlap_fraction: float = 1.0
    """Share of the data-parallel traffic that may overlap backward compute: 1 for PyTorch
    DDP/FSDP bucketed all-reduce, 0 for frameworks that reduce after the last backward."""
    overlap_coefficient: float = 1.1256
    """Slowdown of compute and communication running together (Galvatron's measured gamma,
    overlap_coefficient.json)."""
    dp_bucket_bytes: float = 25 * MIB
    """Gradient bucket size, bytes (PyTorch DDP bucket_cap_mb = 25): latency is paid once
    per bucket, not once per layer."""

    cv_error_p10: float = 0.0
    """10th percentile of the relative error (predicted - measured) / measured of this
    calibration's cross-validated predictions (python -m cost_models.calibrate); with
    cv_error_p90 it bounds 80% of the runs like those it was fitted on. 0 and 0 = not known."""
    cv_error_p90: float = 0.0
    """90th percentile of the same relative error."""

    def __post_init__(self) -> None:
        if not -1 < self.cv_error_p10 <= self.cv_error_p90:
            raise SpecError("constants.cv_error_p10", f"need -1 < cv_error_p10({self.cv_error_p10!r}) <= "
                            f"cv_error_p90({self.cv_error_p90!r})")
        for f in fields(self):
            if f.name in SIGNED:
                continue
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value < 0:
                raise SpecError(f"constants.{f.name}", f"must be a number >= 0, got {value!r}")
        for name in ("gemm_efficiency_max", "fp8_gemm_efficiency_max", "memory_efficiency", "bus_efficiency",
                     "network_efficiency", "p2p_efficiency", "at_scale_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise SpecError(f"constants.{name}", f"must be in (0, 1], got {value!r}")
        if not 0 <= self.dp_overlap_fraction <= 1:
            raise SpecError("constants.dp_overlap_fraction", f"must be in [0, 1], got {self.dp_overlap_fraction!r}")
        if self.overlap_coefficient < 1:
            raise SpecError("constants.overlap_coefficient", f"must be >= 1, got {self.overlap_coefficient!r}")
        for f in fields(self):
            if f.name not in SIGNED:
                value = getattr(self, f.name)
                scale, work = _UNIT_WORK.get(f.name, (1.0, "its unit"))
                unit_time(scale / value if f.name.endswith("efficiency") else value * scale,
                          f"constants.{f.name}", value, work)

    def with_values(self, values: Mapping[str, float]) -> "AnalyticalConstants":
        """A copy with some fields replaced; unknown names are an error."""
        known = {f.name for f in fields(self)}
        for key in values:
            if key not in known:
                raise SpecError(f"constants.{key}", f"unknown constant; known: {', '.join(sorted(known))}")
        return replace(self, **dict(values))  # __post_init__ rejects non-numbers (and booleans)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


_UNIT_WORK = {"gemm_efficiency_max": (1.0, "1 s of peak-rate work"),
              "fp8_gemm_efficiency_max": (1.0, "1 s of peak-rate work"), "memory_efficiency": (1.0, "1 s of peak-rate work"),
              "bus_efficiency": (1.0, "1 s of link-rate work"), "network_efficiency": (1.0, "1 s of link-rate work"),
              "p2p_efficiency": (1.0, "1 s of link-rate work"), "at_scale_efficiency": (1.0, "1 s of link-rate work"),
              "at_scale_ranks": (1e-6, "a 1 us step per rank"), "dp_overlap_fraction": (1.0, "1 s of overlap"),
              "gemm_half_efficiency_flops": (1e-15, "a GEMM's fixed cost at 1 PFLOP/s"),
              "optimizer_bytes_per_param": (1e-6, "1 M parameters' optimizer step at 1 TB/s"),
              "dp_bucket_bytes": (1e-12, "a bucket at 1 TB/s"), "step_latency_factor": (1e-6, "a 1 us hop"),
              "network_step_latency_factor": (1e-6, "a 1 us hop"), "overlap_coefficient": (1.0, "1 s of work")}
"""(scale, unit of work) per constant: the time it gives to one unit (specs.limits.unit_time);
the efficiencies divide (a unit of work takes scale / efficiency), the others multiply."""


def load_calibration(path: str | Path) -> dict[str, Any]:
    """A calibration file as a dict with at least 'constants'; errors name the file and field."""
    path = Path(path)
    raw = read_json(path)
    try:
        check(CalibrationFile, raw)
    except SpecError as err:
        raise err.with_source(str(path)) from None
    if not isinstance(raw, dict) or raw.get("format") != CALIBRATION_FORMAT:
        raise SpecError("format", f"expected {CALIBRATION_FORMAT!r}", str(path))
    if raw.get("version") != CALIBRATION_VERSION:
        raise SpecError("version", f"unsupported {raw.get('version')!r} (this code reads {CALIBRATION_VERSION})",
                        str(path))
    if not isinstance(raw.get("constants"), dict):
        raise SpecError("constants", "must be an object of named numbers", str(path))
    _check_transfers(raw.get("transfers_to", {}), str(path))
    try:
        AnalyticalConstants().with_values(raw["constants"])
    except SpecError as err:
        raise err.with_source(str(path)) from None
    return raw


def _check_transfers(transfers: Any, source: str) -> None:
    """``transfers_to`` (optional): GPU family (gpu_family's lower-case name) -> why constants fitted
    on the file's GPU are taken to hold there without a fit of their own."""
    if not isinstance(transfers, dict):
        raise SpecError("transfers_to", f"must be an object of GPU family -> reason, got {transfers!r}", source)
    for family, reason in transfers.items():
        if family != gpu_family(family):
            raise SpecError(f"transfers_to.{family}", f"must be a GPU family in lower case (e.g. "
                            f"{gpu_family(family)!r})", source)
        if not isinstance(reason, str) or not reason.strip():
            raise SpecError(f"transfers_to.{family}", f"must state the reason as text, got {reason!r}", source)


def constants_for(calibration: str | Path | Mapping[str, float] | None) -> AnalyticalConstants:
    """Defaults, overridden by a calibration file (path) or a dict of named constants."""
    base = AnalyticalConstants()
    if calibration is None or calibration == "":
        return base
    if isinstance(calibration, Mapping):
        return base.with_values(calibration)
    return base.with_values(load_calibration(calibration)["constants"])


def save_calibration(path: str | Path, constants: Mapping[str, float], **meta: Any) -> None:
    """Write a calibration file atomically: the fitted constants plus how they were obtained."""
    path = Path(path)
    AnalyticalConstants().with_values(constants)
    body = {"format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, **meta,
            "constants": dict(constants)}
    atomic_write_json(path, body)


def gpu_family(name: str) -> str:
    """The GPU model a name stands for, lower case (``A100-SXM4-80GB`` -> ``a100``): constants
    fitted on one memory size or form factor of a model are taken to hold for the others."""
    return name.strip().split("-")[0].split()[0].lower() if name.strip() else "?"


def calibration_status(calibration: str | Path | Mapping[str, float] | None, gpu_name: str) -> str:
    """Whether the constants ``constants_for(calibration)`` applies were fitted on ``gpu_name``'s
    GPU: 'calibrated: a100 (vtrain)', 'transferred: H100-fitted constants on H200 (not fitted
    there)' where the file's ``transfers_to`` names the GPU, 'uncalibrated: A100-fitted constants
    on H100', or 'defaults: ...' when no calibration applies (public figures, fitted on no GPU)."""
    gpu = gpu_family(gpu_name)
    if calibration is None or calibration == "":
        return f"defaults: public-figure constants, uncalibrated on {gpu.upper()}"
    if isinstance(calibration, Mapping):
        return f"custom: {len(calibration)} constants given in code on {gpu.upper()}"
    raw = load_calibration(calibration)
    fitted, data = gpu_family(str(raw.get("gpu", ""))), str(raw.get("data", "")) or "unnamed data"
    if fitted == "?":
        return f"uncalibrated: constants fitted on an unstated GPU ({Path(calibration).name}) on {gpu.upper()}"
    if fitted != gpu and gpu in raw.get("transfers_to", {}):
        return f"transferred: {fitted.upper()}-fitted constants ({data}) on {gpu.upper()}, not fitted there"
    if fitted != gpu:
        return f"uncalibrated: {fitted.upper()}-fitted constants on {gpu.upper()}"
    return f"calibrated: {fitted} ({data})"
