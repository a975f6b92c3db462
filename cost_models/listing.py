"""The zoo's clusters as a table for ``--list clusters``: GPU, memory, GPUs per node and NVLink
domain, peaks, and whether the analytical model's constants were fitted on that GPU."""
from __future__ import annotations

from cost_models.constants import calibration_status
from specs import ClusterSpec, cluster_names, load_cluster


def describe_cluster(cluster: ClusterSpec) -> dict[str, object]:
    """One cluster's row: what a planner's numbers rest on."""
    g = cluster.gpu
    return {"cluster": cluster.name, "gpu": g.name, "memory_gib": g.memory_gib, "gpus_per_node": cluster.gpus_per_node,
            "nvlink_domain_gpus": cluster.domain_gpus, "nodes": cluster.nodes, "bf16_tflops": g.peak_tflops,
            "fp8_tflops": g.peak_fp8_tflops, "calibration": calibration_status(cluster.calibration, g.name)}


def cluster_lines() -> list[str]:
    """Every zoo cluster, one a line, its name first (the --list convention), under a header."""
    from tabulate import tabulate
    rows = [describe_cluster(load_cluster(name)) for name in cluster_names()]
    head = ["cluster", "GPU", "GiB", "GPUs/node", "domain", "nodes", "BF16 TF/s", "FP8 TF/s", "calibration (analytical)"]
    body = [[*r.values()][:7] + [f"{r['fp8_tflops']:g}" if r["fp8_tflops"] else "-", r["calibration"]] for r in rows]
    return tabulate(body, headers=head, tablefmt="plain", floatfmt="g").splitlines()
