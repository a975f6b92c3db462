"""Measured runs made by the analytical model itself, for tests of the fits."""
from dataclasses import replace

from cost_models.calibrate import predict
from cost_models.constants import AnalyticalConstants
from cost_models.measured_runs import Run
from specs import load_cluster, model_from_dict, uniform_plan


def synthetic_runs(truth: AnalyticalConstants) -> list[Run]:
    """Ten small runs on dgx-a100-80g whose measured times are the model's own with ``truth``."""
    cluster = load_cluster("dgx-a100-80g")
    runs = []
    for hidden, layers in ((512, 4), (1024, 4)):
        model = model_from_dict({"model_type": "gpt2", "n_embd": hidden, "n_head": 8, "n_layer": layers,
                                 "n_positions": 512, "vocab_size": 8192}, name=f"gpt-{hidden}")
        for tp, dp, pp, mbs, m in ((1, 8, 1, 1, 2), (2, 2, 2, 2, 4), (8, 1, 1, 4, 1), (4, 1, 2, 1, 8), (1, 2, 4, 8, 4)):
            gpus = tp * dp * pp
            cl = replace(cluster, gpus_per_node=gpus)
            plan = uniform_plan(layers, tp=tp, dp=dp, pp=pp, global_batch=mbs * dp * m, micro_batches=m,
                                recompute="full")
            runs.append(Run(model, cl, plan, 0.0))
    times = predict(truth, runs)
    return [Run(r.model, r.cluster, r.plan, t) for r, t in zip(runs, times)]
