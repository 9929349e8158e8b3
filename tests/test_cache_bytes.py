"""cache_bytes / cache_bytes_per_token (cache_valuearch.py) against the bytes a real generation cache holds."""

import pytest
import torch

from hf_valuearch import MODEL_TYPES
from hf_valuearch.cache_valuearch import cache_bytes, cache_bytes_per_token
from hf_valuearch.compat import output_cache
from tests.common import TINY, random_ids, tiny_model

# small KVM chunks so that 30 tokens cross several window moves and state merges
SMALL_KVM = dict(kvm_chunk_size=4, kvm_state_min_slots=4)
CASES = {model_type: (model_type, SMALL_KVM if model_type == "kvm" else {}) for model_type in MODEL_TYPES}
CASES.update({
    "kvm_power_law": ("kvm", dict(kvm_chunk_size=4, kvm_state_schedule="power_law", kvm_growth_factor=2.0,
                                  kvm_state_min_slots=4, kvm_state_max_chunks=100)),
    "bov_sliding": ("bov", dict(mixer_types=["full_attention", "sliding_attention", "sliding_attention"],
                                sliding_window=5)),
    "kvm_and_full": ("kvm", dict(SMALL_KVM, mixer_types=["kvm", "full_attention", "kvm"])),
})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cache_bytes_equal_the_bytes_held(name, dtype):
    model_type, overrides = CASES[name]
    model = tiny_model(model_type, **overrides).to(dtype)
    ids = random_ids(2, 30)
    cache = None
    with torch.no_grad():
        for start, end in ((0, 11), (11, 12), (12, 25), (25, 26), (26, 30)):  # prefill, decode, continuation
            cache = output_cache(model(ids[:, start:end], cache=cache, use_cache=True))
            assert cache.nbytes() == cache_bytes(model.config, dtype, end, batch_size=2)


def test_per_token_formula_of_the_standard_decoder_and_bov():
    layers, kv_width = 3, TINY["num_key_value_heads"] * TINY["hidden_size"] // TINY["num_attention_heads"]
    standard = tiny_model("valuearch").config
    bov = tiny_model("bov").config  # layer 2 (the last third) is a table layer: keys + one int64 id per token
    assert cache_bytes_per_token(standard, torch.float32) == 2 * layers * kv_width * 4
    assert cache_bytes_per_token(bov, torch.bfloat16) == 2 * 2 * kv_width * 2 + (kv_width * 2 + 8)
    assert cache_bytes_per_token(bov, torch.bfloat16, context_length=17) == cache_bytes_per_token(bov, torch.bfloat16)


def test_kvm_cache_stops_growing():
    config = tiny_model("kvm", **SMALL_KVM).config
    assert cache_bytes_per_token(config, torch.float32) == 0.0  # no full-attention layer
    assert cache_bytes(config, torch.float32, 1000) == cache_bytes(config, torch.float32, 20)  # 4 slots + 2 chunks
    with pytest.raises(ValueError, match="context_length"):
        cache_bytes_per_token(config, torch.float32, context_length=0)
