"""Axis 1, value paths: where a layer's attention values come from and how they are mixed.

A value path turns the layer's own residual-stream values `V = h W_V` (computed by the attention
module only when the path reads them) into the values the attention uses.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualValues(nn.Module):
    """Standard attention values, V = h W_V (Vaswani et al., 2017)."""

    reads_residual_values = True

    def forward(self, residual_values: torch.Tensor) -> torch.Tensor:  # [B, T, H_kv, D] -> same
        return residual_values


def build_value_path(config, layer_idx: int) -> nn.Module:
    """The value path of decoder layer `layer_idx`."""
    return ResidualValues()
