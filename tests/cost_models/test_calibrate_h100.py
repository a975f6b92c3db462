"""The H100 calibration: NeMo 24.07's FP8 rows read as Megatron-Core ran them, the shipped
h100.json reproduced by its command, the leave-one-out band, the listing, and the reader's
refusals of a malformed file."""
import json

import numpy as np
import pytest

from cost_models.calibrate import FP8_PARAMS, RECIPES, cross_validate, error_band, main
from cost_models.constants import AnalyticalConstants, calibration_status, load_calibration
from cost_models.measured_runs import NEMO_SHAPES, nemo_h100_runs
from specs import SpecError, load_cluster
from specs.precision import Precision

H100_FILE = load_cluster("dgx-h100").calibration


def test_nemo_rows_with_a_stated_model_become_fp8_megatron_runs():
    runs = nemo_h100_runs()
    names = {r.set_name.removeprefix("nemo:") for r in runs}
    assert len(runs) == 9 and not any(n.startswith("Nemotron") for n in names) and set(NEMO_SHAPES) <= names
    assert all(s.precision == Precision.FP8_DELAYED for r in runs for s in r.plan.layers)
    gpt175 = next(r for r in runs if r.set_name == "nemo:GPT3-175B" and r.cluster.world_size == 128)
    assert gpt175.measured_s == pytest.approx(256 * 2048 / (716 * 128))  # tokens / (tokens/s/GPU x GPUs)
    assert gpt175.plan.virtual_stages == 6 and gpt175.plan.layers[0].sp == "megatron"
    gpt5b = next(r for r in runs if r.set_name == "nemo:GPT3-5B")
    assert gpt5b.model.num_layers == 24 and gpt5b.model.layers[0].ffn_hidden_size == 16384
    # TP communication overlap where the launcher's training config of the model turns it on
    assert {r.set_name.removeprefix("nemo:") for r in runs if r.plan.tp_comm_overlap} == {
        "GPT3-20B", "LLAMA2-70B", "LLAMA3-70B"}
    assert {r.plan.stack for r in runs} == {"megatron-te"}


def test_the_command_reproduces_the_shipped_file(tmp_path):
    out = tmp_path / "h100.json"
    assert main(["--cluster", "dgx-h100", "--out", str(out)]) == 0
    fresh, shipped = load_calibration(out), load_calibration(H100_FILE)
    assert set(fresh["constants"]) == set(shipped["constants"]) == {*FP8_PARAMS, "cv_error_p10", "cv_error_p90"}
    for name, value in shipped["constants"].items():
        assert fresh["constants"][name] == pytest.approx(value, rel=1e-3, abs=1e-4), name
    assert fresh["transfers_to"] == shipped["transfers_to"] and fresh["gpu"] == "H100-SXM5-80GB"


def test_leave_one_out_predicts_each_run_from_the_others():
    runs = nemo_h100_runs()[:4]
    predicted, fitted = cross_validate(runs, folds=len(runs), names=tuple(FP8_PARAMS), max_evals=20)
    assert len(fitted) == 4 and np.all(predicted > 0)
    # each held-out run is predicted by a fit that never saw it: the fits differ
    assert len({round(c.fp8_gemm_efficiency_max, 6) for c in fitted}) == 4
    band = error_band(predicted, np.array([r.measured_s for r in runs]))
    assert band["cv_error_p10"] <= band["cv_error_p90"]


def test_the_fit_moves_only_the_fp8_efficiency():
    c = AnalyticalConstants().with_values(load_calibration(H100_FILE)["constants"])
    assert 0.3 < c.fp8_gemm_efficiency_max < 1.0
    assert c.gemm_efficiency_max == AnalyticalConstants().gemm_efficiency_max
    assert RECIPES["dgx-h100"].names == ("fp8_gemm_efficiency_max",)


def test_listing_says_calibrated_on_h100_and_transferred_on_h200():
    assert calibration_status(H100_FILE, "H100-SXM5-80GB") == "calibrated: h100 (nemo-24.07)"
    assert calibration_status(H100_FILE, "H200-SXM-141GB").startswith("transferred: H100-fitted constants")
    assert calibration_status(H100_FILE, "B200-SXM-180GB") == "uncalibrated: H100-fitted constants on B200"


@pytest.mark.parametrize("change, field", [
    ({"transfers_to": ["h200"]}, "transfers_to"),
    ({"transfers_to": {"H200-SXM": "same die"}}, "transfers_to.H200-SXM"),
    ({"transfers_to": {"h200": " "}}, "transfers_to.h200"),
    ({"constants": {"fp8_gemm_efficiency_max": 1.5}}, "constants.fp8_gemm_efficiency_max"),
    ({"constants": {"fp8_gemm_efficiency_max": "high"}}, "constants.fp8_gemm_efficiency_max"),
])
def test_the_reader_refuses_a_malformed_file_naming_the_field(tmp_path, change, field):
    raw = json.loads(open(H100_FILE).read()) | change
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SpecError) as err:
        load_calibration(path)
    assert err.value.field == field and str(path) in str(err.value)


def test_the_h100_recipe_refuses_an_nccl_folder_in_one_line(tmp_path, capsys):
    assert main(["--cluster", "dgx-h100", "--nccl", str(tmp_path), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--nccl" in err and len(err.strip().splitlines()) == 1
