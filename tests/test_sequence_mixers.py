"""Every sequence mixer is one `SequenceMixer` declaration: module, mask and cache layer."""

import pytest
import torch
from torch.nn import functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

from hf_valuearch.cache_valuearch import SEQUENCE_MIXERS, SequenceMixer, ValueArchCache, cache_bytes
from tests.common import prefill_then_decode, random_ids, tiny_model

MIXER_FIELDS = {"full_attention": {}, "sliding_attention": {"sliding_window": 4},
                "kvm": {"kvm_chunk_size": 4, "kvm_state_min_slots": 4, "kvm_zero_state_rope": False}}


def test_every_declared_mixer_is_tested():
    assert set(SEQUENCE_MIXERS) == set(MIXER_FIELDS)


@pytest.mark.parametrize("mixer", sorted(SEQUENCE_MIXERS))
def test_layers_take_module_and_cache_layer_from_the_declaration(mixer):
    declaration = SEQUENCE_MIXERS[mixer]
    model = tiny_model(mixer_types=[mixer] * 3, **MIXER_FIELDS[mixer])
    for layer_idx, layer in enumerate(model.model.layers):
        module = layer.self_attn.sequence_mixer
        assert (module is None) if declaration.module is None else isinstance(module, declaration.module)
        expected_cache_layer = declaration.cache_layer(model.config, layer_idx)
        assert type(ValueArchCache(model.config).layers[layer_idx]) is type(expected_cache_layer)


class CausalSdpaMixer(torch.nn.Module):
    """A mixer written for the test: causal attention over its own DynamicLayer, no mask."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.groups = config.num_attention_heads // config.num_key_value_heads

    def forward(self, query, key, value, hidden_states, mask, cache):
        past = cache.layers[self.layer_idx].get_seq_length() if cache is not None else 0
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        # query t attends to keys [0, past + t]
        allowed = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool).tril(past)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, enable_gqa=self.groups > 1)
        return out.transpose(1, 2)


def test_a_new_mixer_is_one_declaration(monkeypatch):
    """Declaring module, mask, cache layer and its bytes is all a new mixer needs: with the same weights it gives
    full attention's logits, cached decoding equals the full forward, and the cache-size formula, the cache check,
    output_attentions and assisted decoding follow from the declaration."""
    monkeypatch.setitem(SEQUENCE_MIXERS, "test_sdpa", SequenceMixer(
        mask=lambda *args: None, cache_layer=lambda config, layer_idx: DynamicLayer(),
        cache_bytes=SEQUENCE_MIXERS["full_attention"].cache_bytes, module=CausalSdpaMixer))
    model = tiny_model(mixer_types=["full_attention", "test_sdpa", "test_sdpa"])
    reference = tiny_model()
    ids = random_ids(2, 10)
    full, decoded = prefill_then_decode(model, ids, prefix=4)
    torch.testing.assert_close(decoded, full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(full, reference(ids).logits, atol=1e-5, rtol=1e-5)
    config = model.config
    cache = ValueArchCache(config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    assert cache.nbytes() == cache_bytes(config, torch.float32, 10, batch_size=2)
    with pytest.raises(ValueError, match=r"\[1, 2\].*need a ValueArchCache"):
        model(ids, cache=DynamicCache(config=config))
    with pytest.raises(ValueError, match="output_attentions=True: 'test_sdpa' layers return no attention weights"):
        model(ids, output_attentions=True)


def test_sliding_window_comes_from_the_declaration(monkeypatch):
    """A mixer declared with `sliding_window=True` attends through transformers' interface with the config's
    window (here under a new name: the same logits as "sliding_attention")."""
    monkeypatch.setitem(SEQUENCE_MIXERS, "test_window", SEQUENCE_MIXERS["sliding_attention"])
    windowed = tiny_model(mixer_types=["test_window"] * 3, sliding_window=4)
    reference = tiny_model(mixer_types=["sliding_attention"] * 3, sliding_window=4)
    assert [layer.self_attn.sliding_window for layer in windowed.model.layers] == [4, 4, 4]
    ids = random_ids(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(windowed(ids).logits, reference(ids).logits)
    with pytest.raises(ValueError, match=r"sliding_window.*\['sliding_attention', 'test_window'\]"):
        tiny_model(sliding_window=4)
