"""vTrain validation: cost models and the simulator against measured A100 iteration times.

A cell is one predictor on one slice of one vTrain set; its folder keeps the per-case
predictions (predictions.csv) and its row the slice's mean absolute percentage error.
"""
from __future__ import annotations

import sys
from typing import Any

import pandas as pd

import cost_models
import simulator
from analysis.results import RunRecord
from cost_models import measured_runs

CHUNK = 120
"""Cases per cell (a crash loses at most one chunk)."""
QUICK_STRIDE = {"single": 60, "multi": 10}
"""Quick mode keeps every n-th case of each set..."""
QUICK_MAX_MICRO_BATCHES = 64
"""...of at most this many micro-batches (a 175B run of 128 takes ~25 s to simulate)."""


_WARNED: set[str] = set()


def predictors() -> list[str]:
    """Every registered cost model that can be built for the vTrain clusters without extra
    inputs (a profiled model needs profiles; it is reported on stderr and left out), then the
    simulator."""
    cluster = _cases("single", 1)[0].cluster
    usable = []
    for name in cost_models.available():
        try:
            cost_models.get(name, cluster)
            usable.append(name)
        except ValueError as err:  # SpecError: the model needs inputs we do not have
            if name not in _WARNED:
                _WARNED.add(name)
                print(f"warning: cost model {name!r} left out of vtrain_validation: {err}", file=sys.stderr)
    return [*usable, "simulator"]


def _cases(set_name: str, stride: int, max_micro_batches: int = 0) -> list[Any]:
    cases = measured_runs.load_cases(set_name)
    if max_micro_batches:
        cases = [c for c in cases if c.plan.micro_batches <= max_micro_batches]
    return cases[::stride]


def vtrain_cells(quick: bool) -> list[dict[str, Any]]:
    cells = []
    for set_name in ("single", "multi"):
        stride = QUICK_STRIDE[set_name] if quick else 1
        cap = QUICK_MAX_MICRO_BATCHES if quick else 0
        count = len(_cases(set_name, stride, cap))
        cells += [{"dataset": set_name, "predictor": p, "stride": stride, "max_micro_batches": cap, "chunk": i}
                  for p in predictors() for i in range((count + CHUNK - 1) // CHUNK)]
    return cells


def predict_seconds(predictor: str, case: Any) -> float:
    """Predicted iteration time of a measured case."""
    if predictor == "simulator":
        return float(simulator.simulate(case.model, case.cluster, case.plan).iteration_time_s)
    model = cost_models.get(predictor, case.cluster)
    return float(model.plan_cost(case.model, case.plan).iteration_time_s)


def vtrain_cell(dataset: str, predictor: str, stride: int, chunk: int, max_micro_batches: int = 0) -> RunRecord:
    """Predict every case of one chunk; a case the predictor rejects is kept with its error."""
    cases = _cases(dataset, stride, max_micro_batches)[chunk * CHUNK:(chunk + 1) * CHUNK]
    rows = [_predict_row(predictor, case, chunk * CHUNK + i) for i, case in enumerate(cases)]
    frame = pd.DataFrame(rows)
    ok = frame["predicted_s"].notna()
    ape = (frame.loc[ok, "predicted_s"] - frame.loc[ok, "measured_s"]).abs() / frame.loc[ok, "measured_s"]
    # A case whose plan the predictor rejects (e.g. a measured 1F1B run with fewer micro-batches
    # than stages) is counted, not an error; a chunk where nothing could be predicted is one.
    first = str(frame.loc[~ok, "error"].iloc[0]) if (~ok).any() else ""
    metrics = {"cases": len(frame), "predicted": int(ok.sum()), "rejected": int((~ok).sum()),
               "first_rejection": first, "mape": float(ape.mean() * 100) if len(ape) else None,
               "error": first if not ok.any() else ""}
    return RunRecord(metrics=metrics, inputs={"dataset": dataset, "predictor": predictor},
                     files={"predictions.csv": frame.to_csv(index=False)})


def _predict_row(predictor: str, case: Any, index: int) -> dict[str, Any]:
    row = {"case": index, "model": case.model_key, "gpus": case.cluster.world_size,
           "plan": case.plan.summary(), "measured_s": case.measured_s, "predicted_s": None, "error": ""}
    try:
        row["predicted_s"] = predict_seconds(predictor, case)
    except (ValueError, KeyError, FileNotFoundError) as err:
        row["error"] = f"{type(err).__name__}: {err}"
    return row
