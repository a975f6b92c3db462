"""Flows sharing links max-min fairly, and collectives played out as steps over real links."""
import pytest
import simpy

from simulator.collectives import Fabric, LinkCalibration, halving_doubling, ring_edges
from simulator.network import Network, water_fill
from tests.simulator.handmade import hand_cluster


def _run_flows(capacities, flows):
    """flows: (name, start_s, nbytes, resources); returns [(name, end_s)] in order of ending."""
    env = simpy.Environment()
    net = Network(env, capacities)
    log = []

    def start(name, at, nbytes, resources):
        yield env.timeout(at)
        yield net.put(name, nbytes, {r: 1 for r in resources})
        log.append((name, round(env.now, 9)))
    for f in flows:
        env.process(start(*f))
    env.run()
    return log, net


def test_two_flows_share_one_link():
    # f1 alone for 0.5 s at 1 GB/s (0.5 GB), then both at 0.5 GB/s: f2 ends at 0.5 + 1/0.5 = 2.5,
    # f1 has 0.5 GB left at 2.5 and ends at 3.0 at the full rate.
    log, net = _run_flows({"L": 1.0}, [("f1", 0.0, 2e9, ["L"]), ("f2", 0.5, 1e9, ["L"])])
    assert log == [("f2", 2.5), ("f1", 3.0)]
    assert net.carried_bytes["L"] == pytest.approx(3e9)


def test_flows_on_disjoint_links_do_not_interfere():
    log, _ = _run_flows({"A": 1.0, "B": 1.0}, [("a", 0.0, 1e9, ["A"]), ("b", 0.0, 2e9, ["B"])])
    assert log == [("a", 1.0), ("b", 2.0)]


def test_max_min_fair_gives_the_leftover_to_the_unconstrained_flow():
    # b is held to 0.2 by link B; a gets what b leaves of link L.
    class F:
        def __init__(self, w):
            self.weights = w
    a, b = F({"L": 1}), F({"L": 1, "B": 1})
    rates = water_fill([a, b], {"L": 1.0, "B": 0.2})
    assert rates[a] == pytest.approx(0.8)
    assert rates[b] == pytest.approx(0.2)


def test_bundle_weights_count_streams_on_a_shared_resource():
    # 3 streams of one bundle cross L: each gets a third.
    class F:
        def __init__(self, w):
            self.weights = w
    f = F({"L": 3, "A": 1})
    assert water_fill([f], {"L": 3.0, "A": 10.0})[f] == pytest.approx(1.0)


def _fabric(cluster, **kw):
    env = simpy.Environment()
    net = Network(env, {})
    return env, Fabric(env, cluster, net, calibration=LinkCalibration(), **kw), net


def test_ring_all_reduce_on_four_gpus_is_six_steps():
    # 4 GPUs behind an NVSwitch at 1 GB/s per port, no latency: a ring all-reduce of 4 GB moves
    # 1 GB per rank per step, 2(p-1) = 6 steps of 1 s each.
    env, fabric, net = _fabric(hand_cluster(4, bytes_per_s=1e9))
    ends = []
    net.on_flow_end = lambda flow: ends.append(round(env.now, 9))
    env.process(fabric.collective("ar", "all_reduce", 4e9, [[0, 1, 2, 3]]))
    env.run()
    assert ends == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert net.carried_bytes[("gpu_out", 0)] == pytest.approx(6e9)


def test_a_collective_the_backend_runs_slower_than_its_ring_carries_more_bytes():
    # gloo runs reduce-scatter as an all-reduce: with a slowdown of 2 each of the 3 ring steps
    # of a 4 GB reduce-scatter over 4 GPUs moves 2 GB at 1 GB/s; the all-gather is as its ring.
    env = simpy.Environment()
    net = Network(env, {})
    cal = LinkCalibration(collective_slowdown={"reduce_scatter": 2.0})
    fabric = Fabric(env, hand_cluster(4, bytes_per_s=1e9), net, calibration=cal)
    ends = []
    net.on_flow_end = lambda flow: ends.append((flow.name, round(env.now, 9)))

    def both():
        yield from fabric.collective("rs", "reduce_scatter", 4e9, [[0, 1, 2, 3]])
        yield from fabric.collective("ag", "all_gather", 4e9, [[0, 1, 2, 3]])
    env.process(both())
    env.run()
    assert ends == [("rs", 2.0), ("rs", 4.0), ("rs", 6.0), ("ag", 7.0), ("ag", 8.0), ("ag", 9.0)]


def test_all_reduce_takes_halving_doubling_when_latency_makes_it_faster():
    # 1 ms per step: ring would be 6 x 1 ms + 6 s; halving-doubling sends 2, 1, 1, 2 GB in 4 steps.
    env, fabric, net = _fabric(hand_cluster(4, bytes_per_s=1e9, latency_us=1000.0))
    ends = []
    net.on_flow_end = lambda flow: ends.append(round(env.now, 9))
    env.process(fabric.collective("ar", "all_reduce", 4e9, [[0, 1, 2, 3]]))
    env.run()
    assert ends == [2.001, 3.002, 4.003, 6.004]


def test_ring_steps_share_a_pcie_uplink():
    # Two switches of two GPUs; the uplink (0.5 GB/s) is crossed by one ring edge each way, so
    # every step of a reduce-scatter of 4 GB (1 GB per step) runs at the uplink's 0.5 GB/s.
    cluster = hand_cluster(4, kind="pcie", gpus_per_switch=2, bytes_per_s=1e9, uplink_bytes_per_s=0.5e9)
    env, fabric, _ = _fabric(cluster)
    env.process(fabric.collective("rs", "reduce_scatter", 4e9, [[0, 1, 2, 3]]))
    env.run()
    assert env.now == pytest.approx(3 * 2.0)


def test_coalesced_steps_take_the_same_time_without_contention():
    for coalesce in (False, True):
        env, fabric, _ = _fabric(hand_cluster(4, bytes_per_s=1e9, latency_us=10.0), coalesce_steps=coalesce)
        env.process(fabric.collective("ag", "all_gather", 4e9, [[0, 1, 2, 3]]))
        env.run()
        assert env.now == pytest.approx(3 * (1.0 + 1e-5))


def test_ring_edges_and_halving_doubling_pairs():
    assert ring_edges([[0, 1, 2], [3]]) == [(0, 1), (1, 2), (2, 0)]
    steps = halving_doubling([[0, 1, 2, 3]], 8.0)
    assert [(sorted(e), b) for e, b in steps] == [
        (sorted([(0, 2), (1, 3), (2, 0), (3, 1)]), 4.0), (sorted([(0, 1), (1, 0), (2, 3), (3, 2)]), 2.0),
        (sorted([(0, 1), (1, 0), (2, 3), (3, 2)]), 2.0), (sorted([(0, 2), (1, 3), (2, 0), (3, 1)]), 4.0)]


def test_unknown_collective_is_a_clear_error():
    env, fabric, _ = _fabric(hand_cluster(2))
    with pytest.raises(ValueError, match="collective kind"):
        list(fabric.collective("x", "all_to_everyone", 1.0, [[0, 1]]))


def test_memory_fires_an_out_of_memory_event_a_process_can_wait_for():
    from simulator.hardware import Memory
    env = simpy.Environment()
    mem = Memory(env, gpu=3, capacity_bytes=100.0)
    seen = []

    def allocator():
        for i in range(4):
            yield env.timeout(1.0)
            mem.alloc(f"block {i}", 30.0)
        mem.free("block 0", 30.0)

    def watcher():
        oom = yield mem.out_of_memory
        seen.append((env.now, oom.gpu, oom.what, oom.live_bytes))
    env.process(allocator())
    env.process(watcher())
    env.run()
    assert seen == [(4.0, 3, "block 3", 90.0)]
    assert mem.peak_bytes == 120.0 and mem.level_bytes == 90.0
    with pytest.raises(RuntimeError, match="freeing"):
        mem.free("too much", 1000.0)


def test_ranks_on_two_nodes_of_one_nvlink_domain_never_cross_a_nic():
    # two nodes of 2 GPUs, 1 GB/s ports, one 0.25 GB/s NIC each: a 4-rank ring reduce-scatter of
    # 4 GB (1 GB per step, 3 steps) has one edge leaving each node. As separate domains the NIC
    # sets every step (4 s); in one 4-GPU NVLink domain (GB200 NVL72 trays) the ports do (1 s).
    from dataclasses import replace

    from specs.cluster import InterNodeLink
    base = replace(hand_cluster(2, nodes=2, bytes_per_s=1e9),
                   inter_node=InterNodeLink(nics_per_node=1, nic_bandwidth_gbytes_per_s=0.25, latency_us=0.0))
    for cluster, seconds in ((base, 3 * 4.0), (replace(base, scale_up_domain_gpus=4), 3 * 1.0)):
        env, fabric, net = _fabric(cluster)
        env.process(fabric.collective("rs", "reduce_scatter", 4e9, [[0, 1, 2, 3]]))
        env.run()
        assert env.now == pytest.approx(seconds)
        assert (("nic_out", 0) in net.carried_bytes) == (cluster is base)
