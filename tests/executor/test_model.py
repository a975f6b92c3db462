"""Modules built from ModelSpecs: parameter counts match the spec, every family runs."""
import pytest
import torch

import specs
from executor.model import Block, Transformer, per_sample_loss, synthetic_batch


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-bert", "tiny-llama", "vit-large-24", "llama2-7b"])
def test_block_parameters_match_the_spec(name):
    model = specs.load_model(name)
    if model.layers[0].hidden_size > 256:
        model = model.scaled(hidden_size=64, num_layers=2)
    layer = model.layers[0]
    block = Block(layer)
    assert sum(p.numel() for p in block.parameters()) == layer.param_count()


@pytest.mark.parametrize("name,scale", [
    ("tiny-gpt", {}), ("tiny-bert", {}), ("tiny-llama", {}),
    ("vit-large-24", {"hidden_size": 32, "num_layers": 2}),
    ("t5-large-48", {"hidden_size": 32, "num_layers": 2, "seq_len": 16}),
    pytest.param("swin-huge-32", {"hidden_size": 16}, marks=pytest.mark.slow),  # 3136 patches
])
def test_every_family_trains_one_step(name, scale):
    model = specs.load_model(name)
    model = model.scaled(**scale) if scale else model
    net = Transformer(model, seed=1)
    inputs, targets = synthetic_batch(model, 2, seed=1)
    loss = per_sample_loss(net(inputs), targets)
    assert loss.shape == (2,) and torch.isfinite(loss).all()
    loss.mean().backward()
    assert all(p.grad is not None for n, p in net.named_parameters() if "pooler" not in n)


def test_same_seed_same_weights_different_seed_different():
    model = specs.load_model("tiny-gpt")
    a, b, c = Transformer(model, 3), Transformer(model, 3), Transformer(model, 4)
    wa, wb, wc = (dict(n.named_parameters())["layers.2.mlp.fc1.weight"] for n in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_causal_blocks_ignore_the_future():
    model = specs.load_model("tiny-gpt")
    block = Block(model.layers[0])
    x = torch.randn(1, 8, model.layers[0].hidden_size)
    y = x.clone()
    y[:, 5:] += 1.0
    assert torch.allclose(block(x)[:, :5], block(y)[:, :5], atol=1e-6)
    assert not torch.allclose(block(x)[:, 5:], block(y)[:, 5:])


def test_tied_head_shares_the_token_embedding():
    model = specs.load_model("tiny-gpt")  # head.tied
    net = Transformer(model)
    assert net.head.out.weight is net.embed.tokens.weight
    assert sum(p.numel() for p in net.parameters()) == model.param_count()
