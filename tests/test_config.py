"""ValueArchConfig: validation errors name field, value and what is allowed; random configs build and train."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_valuearch import ValueArchConfig, ValueArchForCausalLM
from tests.common import TINY, tiny_config

INVALID = [
    ({"hidden_size": 0}, "hidden_size"),
    ({"hidden_size": -64}, "hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"intermediate_size": 0}, "intermediate_size"),
    ({"hidden_size": 60, "num_attention_heads": 8}, "num_attention_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"head_dim": 7}, "head_dim"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    ({"attention_dropout": 1.5}, "attention_dropout"),
    ({"qk_norm": "l2"}, "qk_norm"),
    ({"norm_type": "batchnorm"}, "norm_type"),
    ({"norm_type": "layernorm", "depth_routing": "block_attnres", "attnres_block_size": 2}, "norm_type"),
    ({"token_shift": 1}, "token_shift"),
    ({"sublayer_scale": 0.0}, "sublayer_scale"),
    ({"token_shift": True, "value_source": "table", "value_layers": "all"}, "token_shift"),
    ({"mlp_activation": "gelu"}, "mlp_activation"),
    ({"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
    ({"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"value_source": "nonsense"}, "value_source"),
    ({"depth_routing": "nonsense"}, "depth_routing"),
    ({"mixer_types": ["full_attention"]}, "mixer_types"),
    ({"mixer_types": ["full_attention", "mamba", "full_attention"]}, "mixer_types"),
    ({"mixer_types": ["sliding_attention"] * 3}, "sliding_window"),
    ({"sliding_window": 8}, "sliding_window"),
    ({"pad_token_id": 10_000}, "pad_token_id"),
    ({"hidden_size": "64"}, "hidden_size"),
]


@pytest.mark.parametrize("overrides,field", INVALID, ids=[f for _, f in INVALID])
def test_invalid_config_names_field_value_and_allowed(overrides, field):
    with pytest.raises(ValueError) as error:
        tiny_config(**overrides)
    message = str(error.value)
    value = overrides.get(field, overrides.get("mixer_types"))
    assert field in message and "is invalid" in message
    shown = [value] + (value if isinstance(value, list) else [])  # a bad list entry may be named alone
    assert any(repr(v) in message for v in shown) or field == "sliding_window"  # None there: names the mixer
    assert any(word in message for word in ("expected", "allowed", "must"))


def test_defaults_are_llama_and_round_trip(tmp_path):
    config = ValueArchConfig()
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (4096, 32, 128)
    assert config.mixer_types == ["full_attention"] * 32 and config.rotary_dim == 128
    small = tiny_config(partial_rotary_factor=0.5, qk_norm="layernorm")
    small.save_pretrained(tmp_path)
    loaded = ValueArchConfig.from_pretrained(tmp_path)
    assert loaded.rotary_dim == small.rotary_dim == 8
    assert loaded.to_dict() == small.to_dict()


heads = st.sampled_from([(2, 1), (2, 2), (4, 1), (4, 2), (4, 4)])


@st.composite
def valid_configs(draw):
    num_heads, num_kv = draw(heads)
    head_dim = draw(st.sampled_from([8, 16]))
    layers = draw(st.integers(1, 3))
    mixers = draw(st.lists(st.sampled_from(["full_attention", "sliding_attention"]), min_size=layers, max_size=layers))
    return dict(
        vocab_size=draw(st.integers(8, 64)),
        hidden_size=num_heads * head_dim,
        intermediate_size=draw(st.sampled_from([16, 48])),
        num_hidden_layers=layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv,
        tie_word_embeddings=draw(st.booleans()),
        qk_norm=draw(st.sampled_from(["none", "rmsnorm", "layernorm"])),
        mlp_activation=draw(st.sampled_from(["swiglu", "relu2"])),
        final_logit_softcapping=draw(st.sampled_from([None, 5.0, 30.0])),
        partial_rotary_factor=draw(st.sampled_from([0.5, 1.0])),
        mixer_types=mixers,
        sliding_window=draw(st.integers(1, 6)) if "sliding_attention" in mixers else None,
        pad_token_id=None,
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_configs(), st.integers(2, 9))  # a loss needs at least one next-token target
def test_random_valid_configs_train(fields, length):
    torch.manual_seed(0)
    model = ValueArchForCausalLM(ValueArchConfig(**fields))
    ids = torch.randint(0, fields["vocab_size"], (2, length))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


invalid_fields = st.sampled_from([
    ("hidden_size", st.integers(-5, 0)),
    ("num_hidden_layers", st.integers(-3, 0)),
    ("num_key_value_heads", st.sampled_from([3, 5, 7])),
    ("qk_norm", st.text(min_size=1, max_size=5).filter(lambda s: s not in ("none", "rmsnorm", "layernorm"))),
    ("mlp_activation", st.text(min_size=1, max_size=5).filter(lambda s: s not in ("swiglu", "relu2"))),
    ("rms_norm_eps", st.floats(-1.0, 0.0)),
    ("value_source", st.text(min_size=1, max_size=8).filter(lambda s: s != "residual")),
])


@settings(max_examples=30, deadline=None)
@given(invalid_fields.flatmap(lambda pair: st.tuples(st.just(pair[0]), pair[1])))
def test_random_invalid_configs_raise_value_error(field_and_value):
    field, value = field_and_value
    with pytest.raises(ValueError, match=field):
        ValueArchConfig(**{**TINY, field: value})
