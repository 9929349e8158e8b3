"""Axis 2, depth routing: what each sublayer reads from the layers below it.

A routing strategy owns the "stream" that flows through the decoder layers. Each decoder layer holds
one `layer router` and calls, in order:

    attn_input, value_input = router.read_attention(stream)   # value_input: None = same as attn_input
    stream = router.write(stream, attention_output)
    mlp_input = router.read_mlp(stream)
    stream = router.write(stream, mlp_output)

and the model calls `readout.start(embeddings)` before the first layer and `readout.finish(stream)`
before the final norm.
"""

from __future__ import annotations

import torch
from torch import nn


class StandardResidual(nn.Module):
    """The pre-norm residual stream: h_{l+1} = h_l + f_l(Norm(h_l)). The stream is one tensor [B, T, D]."""

    def read_attention(self, stream: torch.Tensor) -> tuple[torch.Tensor, None]:
        return stream, None

    def read_mlp(self, stream: torch.Tensor) -> torch.Tensor:
        return stream

    def write(self, stream: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        return stream + output


class StandardReadout(nn.Module):
    """Model-level ends of the standard residual stream: it starts as the embeddings and is read as is."""

    def start(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def finish(self, stream: torch.Tensor) -> torch.Tensor:
        return stream


def build_layer_router(config, layer_idx: int) -> nn.Module:
    """The depth router of decoder layer `layer_idx`."""
    return StandardResidual()


def build_readout(config) -> nn.Module:
    """The model-level start and final read of the depth routing."""
    return StandardReadout()
