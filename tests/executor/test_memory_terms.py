"""What PyTorch allocates where the profiled cost model charges a transient the executor's
modules make: the token lookup's backward (cost_models.profiled.*LOOKUP_GRADIENT_COPIES)."""
import pytest
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState

import specs
from cost_models.profiled import LOOKUP_GRADIENT_COPIES, TIED_LOOKUP_GRADIENT_COPIES
from executor.model import Transformer, per_sample_loss, synthetic_batch


def _lookup_temporaries(model: specs.ModelSpec, micro_batches: int) -> float:
    """Temporary bytes at the peak of the embedding's backward in the last micro-batch."""
    net = Transformer(model, seed=1)
    inputs, targets = synthetic_batch(model, 2, seed=1)
    tracker = MemTracker()
    tracker.track_external(net)
    with tracker:
        for mb in range(micro_batches):
            if mb:
                tracker.reset_mod_stats()  # a new top-level call is a new micro-batch here
            per_sample_loss(net(inputs), targets).mean().backward()
    stats = tracker.memory_tracking[net.embed]
    snapshot = stats.snapshots[_ModState.PEAK_BW][-1]
    return sum(dev[_MemRefType.TEMP] for dev in snapshot.values())


def _sizes(model: specs.ModelSpec) -> tuple[int, int]:
    """fp32 bytes of (the token table, the position table and the gradient arriving at the
    lookup's output, 2 samples x seq x hidden): the second may or may not be live at the peak
    (the order autograd runs the two lookups' backward in)."""
    emb = model.embedding
    return 4 * emb.vocab_size * emb.hidden_size, 4 * (emb.max_positions + 2 * model.layers[0].seq_len) * emb.hidden_size


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_tied_lookup_backward_holds_three_copies_of_the_table(micro_batches):
    """tiny-gpt ties its head to the token table: in the lookup's backward the head's gradient
    of the matrix, the lookup's dense gradient and their sum are live together."""
    model = specs.load_model("tiny-gpt")
    table, other = _sizes(model)
    assert 0 <= _lookup_temporaries(model, micro_batches) - TIED_LOOKUP_GRADIENT_COPIES * table <= other


def test_an_untied_lookup_backward_holds_one_copy_once_the_gradient_exists():
    """tiny-llama (untied head, no positions): from the second micro-batch the lookup's dense
    gradient is a copy beside the accumulated one, summed into it in place."""
    model = specs.load_model("tiny-llama")
    table, other = _sizes(model)
    assert 0 <= _lookup_temporaries(model, 2) - LOOKUP_GRADIENT_COPIES * table <= other

