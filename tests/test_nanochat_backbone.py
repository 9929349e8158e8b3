"""nanochat backbone fields (issue 11 item 2) and the q/k-norm epsilon (item 3): each against a written-out
forward, and the whole backbone against nanochat's own GPT module on the same weights (a fixture generated with
RiddleHe/nanochat research/bank_of_values, see tests/fixtures/nanochat/README.md)."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F

from hf_valuearch import MODEL_TYPES, BovConfig, BovForCausalLM, ValueArchForCausalLM
from hf_valuearch.cache_valuearch import cache_bytes
from hf_valuearch.compat import output_cache
from hf_valuearch.conversion.nanochat_checkpoints import nanochat_weights
from tests.common import REPO, left_pad, prefill_then_decode, random_ids, tiny_config, tiny_model

NANOCHAT_EPS = torch.finfo(torch.float32).eps  # F.rms_norm(x, (d,)) with eps=None, float32 activations
NANOCHAT = dict(  # every nanochat backbone field on (karpathy/nanochat gpt.py; BoV's gpt_base.py)
    mlp_activation="relu2", qk_norm="rmsnorm", qk_scale=1.2, norm_weights=False, embedding_norm=True,
    smear_gate=True, initialization="nanochat", final_logit_softcapping=15.0, rms_norm_eps=NANOCHAT_EPS,
    tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
)


def nanochat_model(seed=0, **overrides):
    """A tiny model with the nanochat backbone, every zero-initialised path opened (smear, output projections)."""
    model = tiny_model("valuearch", seed=seed, **{**NANOCHAT, **overrides})
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "smear.gate_proj.weight")):
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
        if model.model.smear is not None:
            model.model.smear.scale.fill_(0.8)
    return model


def rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate(x, cos, sin):
    """The standard rotate-half RoPE, x [B, T, H, D], cos/sin [T, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[None, :, None], sin[None, :, None]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def written_out_logits(model, ids):
    """The nanochat backbone written out: norm(wte(ids)), smear, blocks of weightless pre-norms, q/k norm then
    ×1.2, causal (sliding) attention, ReLU² MLP, final norm, soft-capped logits."""
    config, base = model.config, model.model
    eps, heads, kv_heads, head_dim = config.rms_norm_eps, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    B, T = ids.shape
    x = rms(base.embed_tokens.weight[ids], eps)
    gate = base.smear.scale * torch.sigmoid(x[:, 1:, :24] @ base.smear.gate_proj.weight.T)
    x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
    theta = config.rope_parameters["rope_theta"]
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    position = torch.arange(T)
    for layer, mixer in zip(base.layers, config.mixer_types):
        attention = layer.self_attn
        h = rms(x, eps)
        q = rms((h @ attention.q_proj.weight.T).view(B, T, heads, head_dim), config.qk_norm_eps) * config.qk_scale
        k = rms((h @ attention.k_proj.weight.T).view(B, T, kv_heads, head_dim), config.qk_norm_eps) * config.qk_scale
        v = (h @ attention.v_proj.weight.T).view(B, T, kv_heads, head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=2) for t in (k, v))
        allowed = position[None, :] <= position[:, None]
        if mixer == "sliding_attention":
            allowed &= position[:, None] - position[None, :] < config.sliding_window
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, T, -1)
        x = x + out @ attention.o_proj.weight.T
        h = rms(x, eps)
        x = x + F.relu(h @ layer.mlp.up_proj.weight.T).square() @ layer.mlp.down_proj.weight.T
    logits = rms(x, eps) @ model.lm_head.weight.T
    return 15.0 * torch.tanh(logits / 15.0)


def test_nanochat_backbone_matches_written_out_forward():
    """float64 parameters; the RMSNorms and RoPE tables compute in float32 (as Llama's), hence 1e-6."""
    model = nanochat_model(mixer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           sliding_window=4).double()
    ids = random_ids(2, 11)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, written_out_logits(model, ids), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("field, value", [("qk_scale", None), ("embedding_norm", False), ("smear_gate", False)])
def test_each_nanochat_field_changes_the_model(field, value):
    """Switching one field back to Llama's behaviour changes the logits: each field is live on its own
    (norm_weights=False removes parameters that start at ones: test_weightless_norms_have_no_parameters)."""
    ids = random_ids(2, 9)
    model = nanochat_model()
    other = nanochat_model(**{field: value})
    other.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert (model(ids).logits - other(ids).logits).abs().max() > 1e-3


def test_weightless_norms_have_no_parameters():
    model = nanochat_model(qk_norm="layernorm")
    names = [name for name, _ in model.named_parameters()]
    assert not [name for name in names if "norm" in name]
    assert "model.smear.gate_proj.weight" in names and "model.smear.scale" in names
    assert "model.embedding_norm.weight" in tiny_model(embedding_norm=True).state_dict()


def test_nanochat_initialization():
    torch.manual_seed(0)
    config = tiny_config(hidden_size=256, intermediate_size=1024, vocab_size=2000, initialization="nanochat",
                         smear_gate=True, mlp_activation="relu2")
    model = ValueArchForCausalLM(config)
    bound = math.sqrt(3) / math.sqrt(config.hidden_size)
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert projection.weight.abs().max() <= bound
        assert projection.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert mlp.up_proj.weight.abs().max() <= 0.4 * bound
    assert mlp.up_proj.weight.abs().max() > 0.39 * bound
    assert not attention.o_proj.weight.any() and not mlp.down_proj.weight.any()
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(0.8, rel=0.02)
    assert model.lm_head.weight.std().item() == pytest.approx(0.001, rel=0.05)
    smear = model.model.smear
    assert smear.scale.item() == 0 and 0 <= smear.gate_proj.weight.min() and smear.gate_proj.weight.max() <= 0.02
    # the default stays transformers' normal init
    default = tiny_model(hidden_size=256, intermediate_size=1024)
    assert default.model.layers[0].self_attn.o_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_smear_with_cache_decode_crop_and_left_padding():
    model = nanochat_model()
    ids = random_ids(2, 10)
    full, stepped = prefill_then_decode(model, ids, prefix=4)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # crop the cache back by 3 positions and continue: as if never seen
        out = model(ids[:, :8], use_cache=True)
        cache = output_cache(out)
        cache.crop(-3)
        resumed = model(ids[:, 5:10], cache=cache, use_cache=True).logits
        assert cache.smear_inputs.keys.shape[-2] == 10
        torch.testing.assert_close(resumed, full[:, 5:10], rtol=1e-5, atol=1e-5)
        padded, mask = left_pad([ids[0, :10], ids[1, :6]])
        logits = model(padded, attention_mask=mask).logits
        torch.testing.assert_close(logits[1, 4:], model(ids[1:, :6]).logits[0], rtol=1e-5, atol=1e-5)
    cache_bytes_expected = cache_bytes(model.config, torch.float32, 10, batch_size=2)
    assert cache.nbytes() == cache_bytes_expected


def test_qk_norm_eps():
    config = tiny_config(qk_norm="rmsnorm", rms_norm_eps=1e-6)
    assert config.qk_norm_eps == 1e-6  # default: rms_norm_eps
    model = tiny_model(qk_norm="rmsnorm", rms_norm_eps=1e-6, qk_norm_eps=1e-2)
    attention = model.model.layers[0].self_attn
    assert attention.q_norm.variance_epsilon == 1e-2 and model.model.layers[0].input_layernorm.variance_epsilon == 1e-6
    hidden = torch.randn(1, 3, 64)
    q = attention.q_proj(hidden).view(1, 3, -1, attention.head_dim)
    torch.testing.assert_close(attention.q_norm(q), attention.q_norm.weight * rms(q, 1e-2))
    assert tiny_model(qk_norm="layernorm", qk_norm_eps=1e-3).model.layers[0].self_attn.k_norm.eps == 1e-3
    # the papers' values (SATFormer: fla RMSNorm default 1e-5 on q/k, norm_eps 1e-6 elsewhere; KVM: nn.LayerNorm)
    assert (BovConfig().qk_norm_eps, MODEL_TYPES["satformer"][0]().qk_norm_eps) == (1e-6, 1e-5)
    assert MODEL_TYPES["satformer"][0]().rms_norm_eps == 1e-6 and MODEL_TYPES["kvm"][0]().qk_norm_eps == 1e-5


@pytest.mark.parametrize("field, value", [("qk_scale", 1.2), ("qk_scale", -1.0), ("norm_weights", "no"),
                                          ("smear_gate", 1), ("initialization", "xavier"), ("qk_norm_eps", 0.0)])
def test_invalid_backbone_fields(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})  # qk_scale=1.2 without qk_norm: nothing to scale after


# --- against nanochat's own GPT module --------------------------------------------------------------------

FIXTURE = REPO / "tests" / "fixtures" / "nanochat" / "bov_tiny.safetensors"


def fixture_model(tensors, sliding_window: int):
    config = BovConfig(vocab_size=64, hidden_size=32, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=16, **NANOCHAT,
                       mixer_types=["sliding_attention", "full_attention", "full_attention"], sliding_window=sliding_window)
    model = BovForCausalLM(config).eval()
    weights, unplaced = nanochat_weights(tensors, model)  # the converter's mapping (scripts/convert.py --from nanochat)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unplaced and not missing and not unexpected
    return model


def test_matches_nanochat_gpt_base_on_the_same_weights():
    """BoV's nanochat GPTBase (3 layers, GQA, window pattern S L L with a (4, 0) window = 5 keys, smear, BoV table
    at layer 2): logits equal to float32 rounding; read as our window of 4 keys, they are not."""
    fixture = load_file(FIXTURE)
    tensors = {name.removeprefix("model."): t for name, t in fixture.items() if name.startswith("model.")}
    with torch.no_grad():
        logits = fixture_model(tensors, sliding_window=4 + 1)(fixture["input_ids"]).logits
        misread = fixture_model(tensors, sliding_window=4)(fixture["input_ids"]).logits
    torch.testing.assert_close(logits, fixture["logits"], rtol=0, atol=2e-5)
    assert (misread - fixture["logits"]).abs().max() > 0.1
