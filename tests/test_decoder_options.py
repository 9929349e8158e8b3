"""Decoder options (q/k norm, ReLU², logit soft-cap, partial RoPE) against a direct computation."""

import math

import pytest
import torch
from torch.nn import functional as F

from tests.common import random_ids, tiny_model


def rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def direct_logits(model, ids):
    """One pass of the decoder written out from its weights: embeddings, blocks, final norm, head."""
    config = model.config
    eps, heads, kv_heads, head_dim = config.rms_norm_eps, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    batch, length = ids.shape
    rot = config.rotary_dim
    theta = config.rope_parameters["rope_theta"]
    inv_freq = theta ** (-torch.arange(0, rot, 2).float() / rot)  # [rot/2]
    angles = torch.arange(length).float()[:, None] * inv_freq[None]  # [T, rot/2]
    cos, sin = angles.cos(), angles.sin()

    def rope(x):  # [B, H, T, D]: rotate pairs (i, i + rot/2) of the first `rot` dims
        first, second, rest = x[..., : rot // 2], x[..., rot // 2 : rot], x[..., rot:]
        return torch.cat((first * cos - second * sin, second * cos + first * sin, rest), dim=-1)

    def head_norm(x, norm):
        if config.qk_norm == "rmsnorm":
            return rms(x, norm.weight, eps)
        if config.qk_norm == "layernorm":
            return F.layer_norm(x, (head_dim,), norm.weight, norm.bias, eps)
        return x

    h = model.model.embed_tokens.weight[ids]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for layer in model.model.layers:
        attn = layer.self_attn
        x = rms(h, layer.input_layernorm.weight, eps)
        q = head_norm((x @ attn.q_proj.weight.T).view(batch, length, heads, head_dim), attn.q_norm).transpose(1, 2)
        k = head_norm((x @ attn.k_proj.weight.T).view(batch, length, kv_heads, head_dim), attn.k_norm).transpose(1, 2)
        v = (x @ attn.v_proj.weight.T).view(batch, length, kv_heads, head_dim).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
        out = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v  # [B, H, T, D]
        h = h + out.transpose(1, 2).reshape(batch, length, -1) @ attn.o_proj.weight.T
        x = rms(h, layer.post_attention_layernorm.weight, eps)
        mlp = layer.mlp
        if config.mlp_activation == "swiglu":
            inner = F.silu(x @ mlp.gate_proj.weight.T) * (x @ mlp.up_proj.weight.T)
        else:
            inner = F.relu(x @ mlp.up_proj.weight.T) ** 2
        h = h + inner @ mlp.down_proj.weight.T
    logits = rms(h, model.model.norm.weight, eps) @ model.lm_head.weight.T
    cap = config.final_logit_softcapping
    return logits if cap is None else cap * torch.tanh(logits / cap)


OPTIONS = {
    "llama": {},
    "qk_rmsnorm": {"qk_norm": "rmsnorm"},
    "qk_layernorm": {"qk_norm": "layernorm"},
    "relu2": {"mlp_activation": "relu2"},
    "softcap": {"final_logit_softcapping": 2.0},
    "partial_rope": {"partial_rotary_factor": 0.5},
    "partial_rope_quarter": {"partial_rotary_factor": 0.25},
    "all": {"qk_norm": "layernorm", "mlp_activation": "relu2", "final_logit_softcapping": 3.0,
            "partial_rotary_factor": 0.5},
}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_option_matches_direct_computation(options):
    model = tiny_model(**options)
    with torch.no_grad():  # randomise norms so that their weights and biases matter
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5) if name.endswith("weight") else param.uniform_(-0.2, 0.2)
    ids = random_ids(2, 11)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, direct_logits(model, ids), atol=1e-5)


def test_softcap_bounds_logits_and_partial_rope_leaves_tail_position_free():
    model = tiny_model(final_logit_softcapping=0.5, partial_rotary_factor=0.5)
    with torch.no_grad():
        assert model(random_ids(1, 8)).logits.abs().max() <= 0.5
    assert model.model.rotary_emb.inv_freq.numel() == model.config.rotary_dim // 2 == 4
    q = torch.randn(1, 1, 3, 16)
    cos, sin = model.model.rotary_emb(q, torch.arange(3)[None])
    from hf_valuearch.modeling_valuearch import apply_rotary_pos_emb
    rotated, _ = apply_rotary_pos_emb(q, q, cos, sin)
    assert torch.equal(rotated[..., 8:], q[..., 8:]) and not torch.allclose(rotated[..., 1:, :8], q[..., 1:, :8])
