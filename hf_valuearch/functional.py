"""Parameter-free tensor math that several modules share, defined once (carried inside checkpoints)."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, eps: float, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """RMSNorm without weight (Zhang & Sennrich, 2019): x / sqrt(mean(x²) + ε) over the last dimension, computed in
    `compute_dtype` (float32, as Llama does) and returned in x's dtype. [..., D] -> [..., D]."""
    input_dtype = x.dtype
    x = x.to(compute_dtype)
    variance = x.pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(input_dtype)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """GQA: each of the H_kv key/value heads serves n_rep query heads. [B, H_kv, T, D] -> [B, H_kv * n_rep, T, D]."""
    batch, num_key_value_heads, length, head_dim = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, length, head_dim)
    return x.reshape(batch, num_key_value_heads * n_rep, length, head_dim)
