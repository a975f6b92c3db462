"""ClusterSpec: zoo, node scaling, and the bandwidth a group of ranks sees."""
import json

import pytest

import specs
from specs import SpecError, load_cluster
from specs.cluster import cluster_from_dict


@pytest.mark.parametrize("name", specs.cluster_names())
def test_every_zoo_cluster_loads(name):
    cluster = load_cluster(name)
    assert cluster.world_size >= 1 and cluster.gpu.memory_gib > 0


def test_node_count_suffix_scales_the_cluster():
    cluster = load_cluster("dgx-a100-80g:64")
    assert (cluster.nodes, cluster.world_size, cluster.name) == (64, 512, "dgx-a100-80g:64")
    with pytest.raises(SpecError, match="node count"):
        load_cluster("dgx-a100-80g:zero")


def test_consecutive_tp_inside_a_node_beats_strided_tp_across_nodes():
    cluster = load_cluster("dgx-a100-80g:2")
    inside = cluster.group_link([0, 1, 2, 3])
    across = cluster.ring_link([[i, i + 8] for i in range(8)])  # 8 concurrent 2-rank groups
    assert not inside.crosses_nodes and across.crosses_nodes
    assert inside.bandwidth_gbytes_per_s == 300.0
    assert across.bandwidth_gbytes_per_s == 25.0  # 8 flows share 8 x 25 GB/s of NICs


def test_pcie_switch_uplink_is_shared():
    cluster = load_cluster("titan-8")
    assert cluster.group_link([0, 1, 2, 3]).bandwidth_gbytes_per_s == 12.0  # one switch
    assert cluster.group_link(range(8)).bandwidth_gbytes_per_s == 5.0       # crosses the uplinks
    # two strided rings at once: each crosses the uplinks twice per direction
    assert cluster.ring_link([[0, 2, 4, 6], [1, 3, 5, 7]]).bandwidth_gbytes_per_s == 2.5


@pytest.mark.parametrize("name", ["titan-16", "dgx-a100-80g:2"])
def test_ring_link_is_the_transfers_of_each_ring_in_its_order(name):
    """Rings of unequal sizes (and a lone rank, which sends nothing): each rank to the next, the
    last back to the first."""
    cluster = load_cluster(name)
    rings = [[0, 9, 2], [3], [4, 12], [5, 6, 7, 15, 1]]
    edges = [(r[i], r[(i + 1) % len(r)]) for r in rings for i in range(len(r))]
    assert cluster.ring_link(rings) == cluster.transfers_link(edges)


@pytest.mark.parametrize("mutate, field", [
    (lambda c: c.pop("gpu"), "gpu"),
    (lambda c: c["gpu"].update(memory_gib=-4), "gpu.memory_gib"),
    (lambda c: c["intra_node"].update(kind="infiniband"), "intra_node.kind"),
    (lambda c: c.update(gpus_per_node=0), "gpus_per_node"),
    (lambda c: c["intra_node"].update(gpus_per_switch=3), "intra_node.gpus_per_switch"),
    (lambda c: c["gpu"].update(colour="green"), "gpu.colour"),
    (lambda c: c["intra_node"].update(gpus_per_switch=-1), "intra_node.gpus_per_switch"),
    (lambda c: c.update(nodes=True), "nodes"),
    (lambda c: c.update(nodes=10**6), "nodes"),
    (lambda c: c["gpu"].pop("memory_gib"), "gpu.memory_gib"),
])
def test_broken_cluster_files_give_one_line_errors(tmp_path, mutate, field):
    raw = json.loads((specs.zoo.CLUSTERS_DIR / "titan-8.json").read_text())
    mutate(raw)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SpecError) as err:
        load_cluster(str(path))
    assert err.value.field == field and str(err.value).startswith(str(path))
    assert "\n" not in str(err.value)


def test_rank_outside_world_is_rejected():
    with pytest.raises(SpecError, match="rank 9 outside world of 8"):
        cluster_from_dict(json.loads((specs.zoo.CLUSTERS_DIR / "titan-8.json").read_text())).group_link([0, 9])


def test_concurrent_transfers_share_what_they_cross():
    titan = load_cluster("titan-8")
    assert titan.transfers_link([(0, 4)]).bandwidth_gbytes_per_s == 5.0  # one send: the uplink
    # a 4-GPU stage sending to the next switch: four flows on one 5 GB/s uplink
    assert titan.transfers_link([(i, i + 4) for i in range(4)]).bandwidth_gbytes_per_s == 1.25
    dgx = load_cluster("dgx-a100-80g:2")
    assert dgx.transfers_link([(i, i + 8) for i in range(8)]).bandwidth_gbytes_per_s == 25.0
    assert dgx.transfers_link([(0, 0)]).bandwidth_gbytes_per_s == float("inf")  # nothing moves


def test_nvl72_trays_share_one_nvlink_domain():
    rack = load_cluster("gb200-nvl72")
    assert (rack.nodes, rack.gpus_per_node, rack.domain_gpus, rack.world_size) == (18, 4, 72, 72)
    assert rack.node_of(4) == 1 and rack.domain_of(4) == 0
    assert [res for res, _ in rack.path(0, 4)] == [("gpu_out", 0), ("gpu_in", 4)]  # two trays, no NIC
    two_racks = rack.with_nodes(36)
    assert ("nic_out", 17) in [res for res, _ in two_racks.path(71, 72)]  # rack 0 -> rack 1: the NICs
    # a 16-GPU ring on four trays runs at the 900 GB/s NVLink port; on two DGX B200 nodes (same
    # 900 GB/s ports) two ring edges leave each node through its 8 x 50 GB/s of NICs
    inside = rack.with_nodes(4).group_link(range(16))
    across = load_cluster("dgx-b200:2").group_link(range(16))
    assert (inside.bandwidth_gbytes_per_s, inside.crosses_nodes) == (900.0, False)
    assert (across.bandwidth_gbytes_per_s, across.crosses_nodes) == (400.0, True)


def test_every_figure_of_the_new_clusters_names_its_source():
    for name in ("dgx-h100", "dgx-h200", "h100-500w", "dgx-b200", "gb200-nvl72", "mi300x-8"):
        cluster = load_cluster(name)
        named = dict(cluster.sources)
        for key in ("gpu.peak_tflops", "gpu.peak_fp8_tflops", "gpu.memory_gib", "gpu.memory_bandwidth_gbytes_per_s",
                    "intra_node.bandwidth_gbytes_per_s", "inter_node.nics_per_node",
                    "inter_node.nic_bandwidth_gbytes_per_s"):
            assert named.get(key), (name, key)
        assert cluster.gpu.peak_fp8_tflops == pytest.approx(2 * cluster.gpu.peak_tflops, rel=1e-3)  # FP8 = 2x BF16


@pytest.mark.parametrize("mutate, field, words", [
    (lambda c: c.update(scale_up_domain_gpus=12), "scale_up_domain_gpus", "not a multiple of gpus_per_node(8)"),
    (lambda c: c.update(scale_up_domain_gpus=-8), "scale_up_domain_gpus", "greater than or equal to 0"),
    (lambda c: c.update(scale_up_domain_gpus=1152), "scale_up_domain_gpus", "less than or equal to 576"),
    (lambda c: c.update(scale_up_domain_gpus="72"), "scale_up_domain_gpus", "valid integer"),
    (lambda c: c.update(scale_up_domain_gpus=16), "scale_up_domain_gpus", "needs an nvswitch or nvlink"),
    (lambda c: c["gpu"].update(peak_fp8_tflops=0), "gpu.peak_fp8_tflops", "greater than 0"),
    (lambda c: c["gpu"].update(peak_fp8_tflops="fast"), "gpu.peak_fp8_tflops", "valid number"),
    (lambda c: c["gpu"].update(sdpa_flash_tflops=-1), "gpu.sdpa_flash_tflops", "greater than 0"),
    (lambda c: c.update(sources={"gpu.peak_tflopz": "datasheet"}), "sources", "'gpu.peak_tflopz' names no field"),
    (lambda c: c.update(sources={"gpu.peak_tflops": 989}), "sources['gpu.peak_tflops']", "valid string"),
    (lambda c: c.update(sources={"gpu.peak_tflops": ""}), "sources['gpu.peak_tflops']", "at least 1 character"),
])
def test_new_cluster_fields_give_one_line_errors_naming_them(tmp_path, mutate, field, words):
    raw = json.loads((specs.zoo.CLUSTERS_DIR / "titan-8.json").read_text())  # PCIe: a domain beyond it is refused
    mutate(raw)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SpecError) as err:
        load_cluster(str(path))
    assert err.value.field == field and words in str(err.value) and "\n" not in str(err.value)


def test_scale_up_domain_is_checked_when_built_in_code():
    base = load_cluster("dgx-b200")
    from dataclasses import replace
    with pytest.raises(SpecError, match="scale_up_domain_gpus.*not a multiple"):
        replace(base, scale_up_domain_gpus=12)
    assert replace(base, scale_up_domain_gpus=16).with_nodes(2).group_link(range(16)).bandwidth_gbytes_per_s == 900.0


@pytest.mark.parametrize("name", ["dgx-h100:4", "gb200-nvl72:2", "dgx-a100-80g:3"])
def test_port_counting_gives_the_laid_out_paths_bandwidth(name):
    """transfers_link counts edges per GPU port and NIC where paths have no shared uplink: the
    same bandwidth as laying out every edge's path and sharing each resource (random edge sets,
    within and across nodes and NVLink domains)."""
    import random
    import numpy as np
    cluster = load_cluster(name)
    rng = random.Random(name)
    for _ in range(20):
        edges = [(rng.randrange(cluster.world_size), rng.randrange(cluster.world_size)) for _ in range(rng.randint(1, 64))]
        edges = [(a, b) for a, b in edges if a != b] or [(0, 1)]
        src, dst = np.array([a for a, _ in edges]), np.array([b for _, b in edges])
        assert cluster._ports_bandwidth(src, dst) == pytest.approx(cluster._paths_bandwidth(edges), rel=1e-12)
        assert cluster.transfers_link(edges).bandwidth_gbytes_per_s == pytest.approx(cluster._paths_bandwidth(edges))
