"""Shared helpers for the test suite: tiny configs and models (hidden 32-64, 2-4 layers)."""

from __future__ import annotations

import torch

from hf_valuearch import MODEL_TYPES, ValueArchConfig

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def tiny_config(model_type: str = "valuearch", **overrides) -> ValueArchConfig:
    """A tiny config of the named architecture; `overrides` replace any field."""
    config_class = MODEL_TYPES[model_type][0]
    return config_class(**{**TINY, **overrides})


def tiny_model(model_type: str = "valuearch", seed: int = 0, **overrides):
    """A tiny causal LM in eval mode, float32, deterministic weights."""
    torch.manual_seed(seed)
    return MODEL_TYPES[model_type][2](tiny_config(model_type, **overrides)).eval()


def random_ids(batch: int, length: int, vocab: int = TINY["vocab_size"], seed: int = 1) -> torch.Tensor:
    """Token ids that avoid the special ids 0-2."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator)
