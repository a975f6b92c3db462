"""The loss of a vocabulary that runs in its own layout but is not split over ranks (vocab tp 1:
the tp, Ulysses and cp plans' head on its data-parallel replicas)."""
import torch

from executor.model import per_sample_loss
from executor.parallel.layout import Layout
from executor.parallel.vocab import VocabLoss, VocabSplit
from specs import SequenceParallel


def _graph_names(t: torch.Tensor) -> set[str]:
    seen, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(next_fn for next_fn, _ in fn.next_functions)
    return {type(fn).__name__ for fn in seen}


def test_an_unsplit_vocabulary_takes_torchs_cross_entropy_with_the_padding_cut_off():
    split = VocabSplit(tp=1, sp=SequenceParallel.NONE, zero3=False, layout=Layout(tp=1, dp=2), vocab=500, rows=512)
    torch.manual_seed(0)
    logits = torch.randn(2, 16, 512)
    logits[..., 500:] = 30.0  # padding columns: they must not count
    logits.requires_grad_()
    targets = torch.randint(0, 500, (2, 16))
    loss = VocabLoss(split, None, 0)(logits, targets)
    torch.testing.assert_close(loss, per_sample_loss(logits[..., :500], targets))
    # torch's fused log-softmax, not the four extra passes of the vocab-parallel one (its
    # masked copy, exponentials, softmax and scatter: twice the loss's time on a CPU rank)
    names = _graph_names(loss)
    assert "LogSoftmaxBackward0" in names
    assert not any("VocabParallel" in n for n in names), names
    loss.sum().backward()
    assert logits.grad[..., 500:].abs().max() == 0
