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
