"""The fused depth read (hand-written backward) against the paper's read written out (AttnRes Eq. 2-3)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hf_valuearch.depth_routing import depth_read, depth_read_reference, use_reference_depth_read
from tests.common import random_ids, tiny_model


def random_read_inputs(num_queries: int, dtype=torch.float64, seed=0):
    """Four sources [2, 5, 16], queries [k, 16], key norm and output norm with non-trivial weights."""
    generator = torch.Generator().manual_seed(seed)
    values = [torch.randn(2, 5, 16, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
              for _ in range(4)]
    queries = torch.randn(num_queries, 16, generator=generator, dtype=torch.float64).requires_grad_()
    key_weight = (1 + 0.3 * torch.randn(16, generator=generator, dtype=torch.float64)).requires_grad_()
    norm_weight = (1 + 0.3 * torch.randn(16, generator=generator, dtype=torch.float64)).to(dtype).requires_grad_()
    key_norm = SimpleNamespace(weight=key_weight, eps=1e-6)
    norm = SimpleNamespace(weight=norm_weight, variance_epsilon=1e-5)
    return values, queries, key_norm, norm


def test_reference_read_hand_computed():
    # v0 = [1, 1] -> RMSNorm [1, 1]; v1 = [2, 0] -> RMSNorm [√2, 0]; w = [1, 0]: logits 1 and √2 (Eq. 2).
    values = [torch.tensor([[[1.0, 1.0]]]), torch.tensor([[[2.0, 0.0]]])]
    key_norm = SimpleNamespace(weight=torch.ones(2), eps=0.0)
    norm = SimpleNamespace(weight=None, variance_epsilon=0.0)
    (out,), alpha = depth_read_reference(values, torch.tensor([[1.0, 0.0]]), key_norm, norm)
    a1 = 1 / (1 + math.exp(1 - math.sqrt(2)))
    torch.testing.assert_close(alpha[:, 0, 0, 0], torch.tensor([1 - a1, a1]))
    mixed = torch.tensor([(1 - a1) + 2 * a1, 1 - a1])  # Eq. 3, then the pre-norm without weight
    torch.testing.assert_close(out[0, 0], mixed / mixed.square().mean().sqrt())


@pytest.mark.parametrize("num_queries, average", [(1, False), (2, False), (2, True)])
def test_fused_read_equals_reference_values_and_gradients(num_queries, average):
    """float64: outputs, α and the gradients of values, queries, key-norm and norm weights agree to 1e-10."""
    values, queries, key_norm, norm = random_read_inputs(num_queries)
    inputs = [*values, queries, key_norm.weight, norm.weight]
    grad_outputs = [torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(1 if average else num_queries)]

    def run(read):
        outputs, alpha = read(values, queries, key_norm, norm, average_mixtures=average)
        gradients = torch.autograd.grad(outputs, inputs, grad_outputs)
        return [*outputs, alpha, *gradients]

    for fused, reference in zip(run(depth_read), run(depth_read_reference), strict=True):
        torch.testing.assert_close(fused, reference, rtol=1e-10, atol=1e-10)


def test_fused_read_equals_reference_in_bfloat16():
    """bf16 values and norm weight: both compute in float32 and round once; they agree to bf16 rounding."""
    values, queries, key_norm, norm = random_read_inputs(2, dtype=torch.bfloat16)
    fused, fused_alpha = depth_read(values, queries, key_norm, norm)
    reference, reference_alpha = depth_read_reference(values, queries, key_norm, norm)
    torch.testing.assert_close(fused_alpha, reference_alpha, rtol=1e-5, atol=1e-6)
    for got, expected in zip(fused, reference, strict=True):
        assert got.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(got, expected, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("model_type, extra", [
    ("attnres", {"attnres_block_size": 2}),
    ("rd_attnres", {"value_route": "learned"}),
    ("rd_attnres", {"value_route": "average"}),
    ("rd_attnres", {"value_route": "frozen"}),
])
def test_model_with_reference_read_equals_fused(model_type, extra):
    """The switch: a whole (RD-)AttnRes model gives the same loss and parameter gradients with either read."""
    model = tiny_model(model_type, **extra).double().train()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "route_query" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    input_ids = random_ids(2, 9)

    def loss_and_gradients():
        model.zero_grad()
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    fused_loss, fused_gradients = loss_and_gradients()
    use_reference_depth_read(model)
    assert all(router.reference_read for router in (layer.router for layer in model.model.layers))
    reference_loss, reference_gradients = loss_and_gradients()
    use_reference_depth_read(model, enabled=False)
    torch.testing.assert_close(fused_loss, reference_loss, rtol=1e-12, atol=1e-12)
    assert fused_gradients.keys() == reference_gradients.keys()
    assert any("route_query" in name for name in fused_gradients)
    for name, gradient in fused_gradients.items():
        torch.testing.assert_close(gradient, reference_gradients[name], rtol=1e-9, atol=1e-11, msg=name)
