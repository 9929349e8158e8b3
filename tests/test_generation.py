"""Cache and generation, for every registered model type: decode == prefill, cache on == cache off."""

import pytest
import torch

from hf_valuearch import MODEL_TYPES
from hf_valuearch.cache_valuearch import ValueArchCache
from hf_valuearch.compat import output_cache
from tests.common import left_pad, random_ids, tiny_model

ALL_TYPES = sorted(MODEL_TYPES)


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_step_by_step_logits_equal_full_forward(model_type):
    model = tiny_model(model_type)
    ids = random_ids(2, 24)
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        steps, cache = [out.logits], output_cache(out)
        assert isinstance(cache, ValueArchCache)
        for t in range(5, 24, 3):  # multi-token continuations, then single tokens
            chunk = ids[:, t : t + 3] if t < 14 else ids[:, t : t + 1]
            out = model(chunk, cache=cache, use_cache=True)
            steps.append(out.logits)
            if chunk.shape[1] == 1 and t + 1 < 24:
                for s in range(t + 1, min(t + 3, 24)):
                    out = model(ids[:, s : s + 1], cache=cache, use_cache=True)
                    steps.append(out.logits)
        stepped = torch.cat(steps, dim=1)[:, :24]
    assert stepped.shape == full.shape
    assert (stepped - full).abs().max() <= 1e-5


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_greedy_generation_same_with_and_without_cache_left_padded(model_type):
    model = tiny_model(model_type)
    prompts = [random_ids(1, 9, seed=4)[0], random_ids(1, 5, seed=5)[0]]
    ids, mask = left_pad(prompts)
    length = ids.shape[1]
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    with_cache = model.generate(ids, use_cache=True, **kwargs)
    without_cache = model.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without_cache)
    for row, prompt in enumerate(prompts):  # each padded row continues as the prompt alone does
        alone = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(with_cache[row, length:], alone[0, len(prompt):])


def test_sliding_window_layers_cache_only_the_window():
    model = tiny_model(mixer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=4)
    ids = random_ids(1, 20)
    with torch.no_grad():
        full = model(ids).logits
        cache = output_cache(model(ids[:, :10], use_cache=True))
        steps = [model(ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(10, 20)]
    assert torch.allclose(torch.cat(steps, 1), full[:, 10:], atol=1e-5)
    assert cache.layers[0].keys.shape[2] <= 4 and cache.layers[1].keys.shape[2] == 20
    # a window covering the sequence is full attention
    wide = tiny_model(mixer_types=["sliding_attention"] * 3, sliding_window=64)
    reference = tiny_model()
    with torch.no_grad():
        assert torch.allclose(wide(ids).logits, reference(ids).logits, atol=1e-6)


def test_logits_to_keep_hidden_states_and_tuple_output():
    model = tiny_model()
    ids = random_ids(2, 10)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        last = model(ids, logits_to_keep=1).logits
        as_tuple = model(ids, return_dict=False)
    assert last.shape == (2, 1, model.config.vocab_size)
    assert torch.allclose(last[:, 0], out.logits[:, -1], atol=1e-6)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert isinstance(as_tuple, tuple) and torch.allclose(as_tuple[0], out.logits)


def test_out_of_range_ids_and_missing_inputs_raise_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[5, model.config.vocab_size]]))
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model()
