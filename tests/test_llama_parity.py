"""The standard decoder is transformers' Llama: same logits, same generation, bit-identical round trip."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from hf_valuearch import ValueArchForCausalLM
from hf_valuearch.conversion import convert, valuearch_to_llama
from tests.common import random_ids, run_script, tiny_model


def random_llama(tie: bool, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # move norms away from 1 so that they are exercised
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_converted_llama_has_same_logits_and_generation(tie):
    llama = random_llama(tie)
    ours = convert(llama, "valuearch")
    assert isinstance(ours, ValueArchForCausalLM)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tie
    ids = random_ids(2, 20)
    with torch.no_grad():
        difference = (llama(ids).logits - ours(ids).logits).abs().max().item()
    assert difference <= 1e-5
    prompt = random_ids(2, 6, seed=3)
    mask = torch.ones_like(prompt)
    expected = llama.generate(prompt, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    actual = ours.generate(prompt, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(expected, actual)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_convert_script_round_trip_is_bit_identical(tmp_path, tie):
    llama = random_llama(tie, seed=1)
    llama.save_pretrained(tmp_path / "llama")
    for source, target, name in [("llama", "ours", "valuearch"), ("ours", "back", "llama")]:
        run_script("convert", "--input", str(tmp_path / source), "--output", str(tmp_path / target), "--to", name)
    original = load_file(tmp_path / "llama" / "model.safetensors")
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert original.keys() == back.keys()
    assert all(torch.equal(original[key], back[key]) for key in original)
    original_config = LlamaConfig.from_pretrained(tmp_path / "llama").to_diff_dict()
    back_config = LlamaConfig.from_pretrained(tmp_path / "back").to_diff_dict()
    assert {k: v for k, v in original_config.items() if k != "transformers_version"} == \
           {k: v for k, v in back_config.items() if k != "transformers_version"}
    ours = ValueArchForCausalLM.from_pretrained(tmp_path / "ours")
    assert (tmp_path / "ours" / "modeling_valuearch.py").exists()
    ids = random_ids(1, 12)
    with torch.no_grad():
        assert torch.allclose(llama(ids).logits, ours(ids).logits, atol=1e-5)


def test_non_standard_model_refuses_conversion_to_llama():
    model = tiny_model(qk_norm="rmsnorm")
    with pytest.raises(ValueError, match="qk_norm"):
        valuearch_to_llama(model)
    with pytest.raises(ValueError, match="allowed targets"):
        convert(model, "gpt2")


def test_eager_and_sdpa_agree():
    model = tiny_model()
    ids = random_ids(2, 16)
    with torch.no_grad():
        sdpa = model(ids).logits
        model.set_attn_implementation("eager")
        eager = model(ids).logits
    assert torch.allclose(sdpa, eager, atol=1e-5)
