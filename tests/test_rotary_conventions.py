"""RoPE conventions of the papers' code (issue 11 item 4): KVM's frequencies (1/θ)^linspace(0, 1, n) as
rope_type "linspace", and the q/k row permutation a converter applies for KVM-paper's interleaved, -θ rotation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_valuearch import KvmConfig
from hf_valuearch.conversion.kvm_paper_checkpoints import paper_rotary_permutation
from hf_valuearch.training import load_config
from hf_valuearch.modeling_valuearch import ValueArchRotaryEmbedding, apply_rotary_pos_emb
from tests.common import tiny_config, tiny_model

KVM_CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs" / "kvm").glob("**/*.json"))


def paper_frequencies(theta: float, n: int) -> torch.Tensor:
    """KVM paper: angular_freq = (1/θ)^linspace(0, 1, n) = θ^(-i/(n-1)), in float64."""
    return torch.tensor([theta ** (-i / (n - 1)) for i in range(n)], dtype=torch.float64)


def test_linspace_frequencies_are_the_papers():
    config = KvmConfig(vocab_size=97, hidden_size=768, intermediate_size=64, num_hidden_layers=1, num_attention_heads=6)
    assert config.rope_parameters == {"rope_type": "linspace", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    inv_freq = ValueArchRotaryEmbedding(config).inv_freq
    assert inv_freq.shape == (32,)  # rope_partial_dim 64 of head_dim 128
    torch.testing.assert_close(inv_freq.double(), paper_frequencies(10000.0, 32), rtol=1e-6, atol=0)
    assert torch.equal(inv_freq, (1 / 10000.0) ** torch.linspace(0.0, 1.0, steps=32, dtype=torch.float32))
    # the same frequencies as "default" with θ' = θ^(n/(n-1)), up to float32 rounding
    mapped = KvmConfig(**{**config.to_dict(), "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0 ** (32 / 31), "partial_rotary_factor": 0.5}})
    torch.testing.assert_close(ValueArchRotaryEmbedding(mapped).inv_freq.double(), paper_frequencies(10000.0, 32),
                               rtol=2e-6, atol=0)
    # an explicit rope choice stays as given (e.g. a Llama converted to KVM keeps its own RoPE)
    default = KvmConfig(**{**config.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
    assert default.rope_parameters["rope_type"] == "default"


@pytest.mark.parametrize("path", KVM_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_kvm_configs_use_the_papers_frequencies_and_epsilons(path):
    config = load_config(str(path))
    n = config.rotary_dim // 2
    torch.testing.assert_close(ValueArchRotaryEmbedding(config).inv_freq.double(),
                               paper_frequencies(config.rope_parameters["rope_theta"], n), rtol=1e-6, atol=0)
    assert config.rope_parameters["rope_theta"] == 10000.0 and json.loads(path.read_text())["qk_norm_eps"] == 1e-5
    assert config.qk_norm_eps == 1e-5


def test_linspace_rotary_survives_save_and_load(tmp_path):
    """Non-persistent inv_freq is rebuilt by `_init_weights` with the model's own rope type."""
    model = tiny_model("kvm", hidden_size=64, num_attention_heads=2, kvm_chunk_size=8, kvm_state_min_slots=8)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    assert torch.equal(loaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    torch.testing.assert_close(loaded.model.rotary_emb.inv_freq.double(), paper_frequencies(10000.0, 8),
                               rtol=1e-6, atol=0)


def test_rope_tables_rounded_to_bfloat16():
    """rope_table_dtype="bfloat16": float32 cos/sin equal to the bf16-rounded tables (KVM-paper's), and only then."""
    config = tiny_config("kvm", hidden_size=64, num_attention_heads=2, kvm_chunk_size=8, kvm_state_min_slots=8,
                         rope_table_dtype="bfloat16")
    x, positions = torch.zeros(1, 1, 4), torch.arange(300)[None]
    cos, sin = ValueArchRotaryEmbedding(config)(x, positions)
    exact_cos, exact_sin = ValueArchRotaryEmbedding(tiny_config("kvm", hidden_size=64, num_attention_heads=2,
                                                                kvm_chunk_size=8, kvm_state_min_slots=8))(x, positions)
    assert cos.dtype == torch.float32 and torch.equal(cos, exact_cos.bfloat16().float())
    assert torch.equal(sin, exact_sin.bfloat16().float()) and not torch.equal(cos, exact_cos)
    with pytest.raises(ValueError, match="rope_table_dtype"):
        tiny_config(rope_table_dtype="float8")


def kvm_paper_rotary(x: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """KVM-paper's rotation written out: pairs (x_2i, x_2i+1) of the first 2n dims rotate by -θ_i t,
    y_2i = x_2i cos + x_2i+1 sin, y_2i+1 = x_2i+1 cos - x_2i sin; the other dims pass. x: [B, H, T, D]."""
    n = inv_freq.shape[0]
    angles = positions[:, None].double() * inv_freq.double()  # [T, n]
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0 : 2 * n : 2], x[..., 1 : 2 * n : 2]
    rotated = torch.stack([even * cos + odd * sin, odd * cos - even * sin], dim=-1).flatten(-2)
    return torch.cat([rotated, x[..., 2 * n :]], dim=-1)


def test_converter_permutation_maps_the_papers_rotation_to_ours():
    """The converter convention (documented in docs/fidelity.md): permuting every q/k head's rows of W_Q, W_K, and
    the per-dim q/k / state LayerNorm weights, by `paper_rotary_permutation` (the kvm-paper converter's)
    gives rotated vectors that are the paper's, permuted; scores q·k are unchanged and the unrotated half stays in place for the state keys."""
    config = tiny_config("kvm", hidden_size=64, num_attention_heads=2, kvm_chunk_size=8, kvm_state_min_slots=8)
    rotary = ValueArchRotaryEmbedding(config).double()
    head_dim, rotary_dim = config.head_dim, config.rotary_dim
    perm = paper_rotary_permutation(head_dim, rotary_dim)
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 9, head_dim, generator=generator, dtype=torch.float64) for _ in range(2))
    positions = torch.arange(9)
    cos, sin = rotary(q, positions[None])
    ours_q, ours_k = apply_rotary_pos_emb(q[..., perm], k[..., perm], cos, sin)
    paper_q, paper_k = (kvm_paper_rotary(x, rotary.inv_freq, positions) for x in (q, k))
    torch.testing.assert_close(ours_q, paper_q[..., perm], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours_q @ ours_k.transpose(-1, -2), paper_q @ paper_k.transpose(-1, -2), rtol=1e-6, atol=1e-6)
    assert sorted(perm[:rotary_dim].tolist()) == list(range(rotary_dim))  # zeroing the rotary dims commutes
    weight, bias = torch.randn(head_dim, generator=generator), torch.randn(head_dim, generator=generator)
    layer_norm = torch.nn.functional.layer_norm
    torch.testing.assert_close(layer_norm(q.float()[..., perm], (head_dim,), weight[perm], bias[perm]),
                               layer_norm(q.float(), (head_dim,), weight, bias)[..., perm])
