"""executor.live_memory: peaks of live storages, worked out by hand, beside MemTracker, and under
the split backward MemTracker cannot follow."""
import pytest
import torch

from executor.live_memory import LiveStorageBytes

MIB = 2**20


def test_peak_counts_what_is_alive_at_once():
    """1 MiB tracked; 2 MiB made and freed; then 1 MiB: the peak is 1 + 2 MiB."""
    kept = torch.zeros(MIB // 4)
    tracker = LiveStorageBytes()
    tracker.track([kept])
    with tracker:
        a = torch.ones(MIB // 2)
        del a
        b = torch.ones(MIB // 4)
    assert tracker.peak_bytes == 3 * MIB
    assert tracker.live_bytes == 2 * MIB
    del b


def test_storages_resized_in_place_count_at_their_size():
    """FSDP2 frees an unsharded parameter by resizing its storage to 0."""
    tracker = LiveStorageBytes()
    with tracker:
        a = torch.ones(MIB // 4)
        a.untyped_storage().resize_(0)
        b = torch.ones(MIB // 4)
    assert tracker.peak_bytes == MIB
    del a, b


def test_same_peak_as_memtracker_on_a_forward_and_backward():
    from torch.distributed._tools.mem_tracker import MemTracker
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    x = torch.randn(64, 256)

    def step():
        model(x).square().sum().backward()
        model.zero_grad(set_to_none=True)

    step()
    reference = MemTracker()
    reference.track_external(model)
    with reference:
        step()
    ours = LiveStorageBytes()
    ours.track([list(model.parameters())])
    with ours:
        step()
    theirs = sum(v.get("Total", 0) for v in reference.get_tracker_snapshot("peak").values())
    assert ours.peak_bytes == pytest.approx(theirs, rel=0.05)


def test_it_follows_the_split_backward_memtracker_refuses():
    """torch.distributed.pipelining's input-gradient half (autograd.grad on a leaf input)."""
    from torch.distributed.pipelining._backward import stage_backward_input
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))
    x = torch.randn(32, 64, requires_grad=True)
    tracker = LiveStorageBytes()
    with tracker:
        out = model(x).sum()
        stage_backward_input([out], None, [x], list(model.parameters()))
    assert x.grad is not None and tracker.peak_bytes >= x.numel() * 4
