"""A cost model with hand-set numbers, and tiny clusters, for timelines worked out by hand."""
from __future__ import annotations

from cost_models import CostModel, LayerTime, MemoryBreakdown
from specs import ClusterSpec, GPUSpec, InterNodeLink, IntraNodeLink, model_from_dict

GIB = 1024**3


class HandCostModel(CostModel):
    """Every layer: forward_s, backward_s (weight_grad_s of it W), update_s; parameter, gradient
    and activation bytes as given, and kept_for_w_bytes kept from B to W under a split backward;
    the embedding and head cost nothing."""

    name = "hand"

    def __init__(self, cluster: ClusterSpec, *, forward_s: float = 1.0, backward_s: float = 2.0,
                 update_s: float = 0.0, states_bytes: float = 0.0, activation_bytes: float = 0.0,
                 gradient_bytes: float = 0.0, weight_grad_s: float = 0.0, kept_for_w_bytes: float = 0.0) -> None:
        super().__init__(cluster)
        self.runtime_overhead_bytes = 0.0
        self.t = LayerTime(forward_s=forward_s, backward_s=backward_s, update_s=update_s, weight_grad_s=weight_grad_s)
        self.states_bytes = states_bytes
        self.activation_bytes = activation_bytes
        self.gradient_bytes = gradient_bytes
        """Unsharded; ZeRO-2/3 keep 1/dp of it."""
        self.kept_for_w_bytes = kept_for_w_bytes

    def layer_time(self, layer, strategy, micro_batch_size, micro_batches, first_rank=0):
        return self.t

    def weight_wait_bytes(self, layer, strategy, micro_batch_size):
        return self.kept_for_w_bytes

    def layer_memory(self, layer, strategy, micro_batch_size, in_flight):
        shard = strategy.dp if strategy.dp_type in ("zero2", "zero3") else 1
        return MemoryBreakdown(parameters_bytes=self.states_bytes, gradients_bytes=self.gradient_bytes / shard,
                               activations_bytes=self.activation_bytes * in_flight)

    def transition_time(self, layer, prev, nxt, micro_batch_size, first_rank=0):
        return 0.0

    def collective_time(self, kind, nbytes, groups):
        return 0.0

    def p2p_time(self, nbytes, src, dst, senders=1):
        return 0.0

    def vocab_cost(self, model, plan, stage, world_size):
        return LayerTime(forward_s=0.0, backward_s=0.0), MemoryBreakdown()


def tiny_model(layers: int, hidden: int = 64, seq: int = 8, heads: int = 1):
    """A GPT whose pipeline message is hidden * seq * 2 bytes per sample (1024 by default)."""
    return model_from_dict({"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers,
                            "n_positions": seq, "seq_length": seq, "vocab_size": 64, "tie_word_embeddings": False},
                           name="hand-gpt")


def hand_cluster(gpus: int, *, bytes_per_s: float = 1e9, latency_us: float = 0.0, memory_gib: float = 80.0,
                 kind: str = "nvswitch", gpus_per_switch: int = 0, uplink_bytes_per_s: float = 0.0,
                 nodes: int = 1) -> ClusterSpec:
    return ClusterSpec(name="hand", nodes=nodes, gpus_per_node=gpus,
                       gpu=GPUSpec(name="hand", peak_tflops=100.0, memory_gib=memory_gib,
                                   memory_bandwidth_gbytes_per_s=1000.0),
                       intra_node=IntraNodeLink(kind=kind, bandwidth_gbytes_per_s=bytes_per_s / 1e9,
                                                latency_us=latency_us, gpus_per_switch=gpus_per_switch,
                                                switch_uplink_gbytes_per_s=uplink_bytes_per_s / 1e9),
                       inter_node=InterNodeLink(nics_per_node=1, nic_bandwidth_gbytes_per_s=bytes_per_s / 1e9,
                                                latency_us=latency_us))


def timeline(result, gpu: int, stream: str = "compute", digits: int = 6) -> list[tuple[str, float, float]]:
    """(name, start, end) of one GPU stream, rounded."""
    return [(name, round(a, digits), round(b, digits)) for g, s, name, a, b in result.spans
            if g == f"GPU {gpu}" and s == stream]
