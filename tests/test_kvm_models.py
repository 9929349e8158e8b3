"""KVM user paths: config files, padded batches and generate, cache memory, diagnostics, save/load, conversion."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from hf_valuearch import MODEL_TYPES, ValueArchConfig, ValueArchForCausalLM
from hf_valuearch.compat import output_cache
from hf_valuearch.conversion import convert_checkpoint
from hf_valuearch.conversion.kvm import llama_to_kvm
from hf_valuearch.training import load_config
from tests.common import TINY, left_pad, prefill_then_decode, random_ids, tiny_model

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "kvm"


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_paper_config_files_load(path):
    config = load_config(str(path))
    assert config.head_dim == 128 and config.rotary_dim == 64 and config.kvm_chunk_size == 256
    tiny = load_config(str(CONFIG_DIR / "tiny" / path.name))
    for field in ("kvm_state_schedule", "kvm_head_temperatures", "kvm_merge_gate", "kvm_merge_gate_appends",
                  "kvm_sink_slots", "kvm_readout_radius", "kvm_zero_state_rope"):
        assert getattr(tiny, field) == getattr(config, field)
    assert ("sliding_attention" in tiny.mixer_types) == ("sliding_attention" in config.mixer_types)


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "tiny").glob("*.json")), ids=lambda p: p.stem)
def test_tiny_config_files_build_and_decode_like_prefill(path):
    config = load_config(str(path))
    torch.manual_seed(0)
    model = MODEL_TYPES[config.model_type][2](config).eval()
    mixer = next(layer.self_attn.sequence_mixer for layer in model.model.layers if layer.self_attn.sequence_mixer)
    assert (mixer.state_temperature is not None) == config.kvm_head_temperatures
    assert (mixer.merge_gate_proj is not None) == config.kvm_merge_gate
    prefill, decoded = prefill_then_decode(model, random_ids(1, 50), 30)
    torch.testing.assert_close(decoded, prefill, atol=1e-5, rtol=0)


def test_left_padded_batches_match_each_sequence_alone():
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4,
                       mixer_types=["kvm", "full_attention", "kvm"])
    sequences = [random_ids(1, 30, seed=3), random_ids(1, 19, seed=4), random_ids(1, 7, seed=5)]
    ids, mask = left_pad(sequences)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        for row, sequence in enumerate(sequences):
            alone = model(sequence).logits
            torch.testing.assert_close(batched[row, -sequence.shape[1]:], alone[0], atol=1e-5, rtol=0)
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0)
        for row, sequence in enumerate(sequences):
            alone = model.generate(sequence, max_new_tokens=14, do_sample=False, pad_token_id=0)
            assert generated[row, ids.shape[1]:].tolist() == alone[0, sequence.shape[1]:].tolist()


def count_extend_calls(monkeypatch) -> list[int]:
    """Record the batch size of every `KVMMixer.extend` call."""
    from hf_valuearch.kvm import KVMMixer

    calls, extend = [], KVMMixer.extend
    monkeypatch.setattr(KVMMixer, "extend", lambda self, state, queries, *a, **k: (
        calls.append(queries.shape[0]), extend(self, state, queries, *a, **k))[1])
    return calls


def test_padded_prefill_runs_the_batch_at_once(monkeypatch):
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4)
    sequences = [random_ids(1, 23, seed=3), random_ids(1, 9, seed=4), random_ids(1, 2, seed=5)]
    ids, mask = left_pad(sequences)
    calls = count_extend_calls(monkeypatch)
    with torch.no_grad():
        cache = output_cache(model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                                   use_cache=True))
    assert calls == [3] * 3  # one call per layer for the whole batch
    alone = [output_cache(model(sequence, use_cache=True)) for sequence in sequences]
    for layer_idx, layer in enumerate(cache.layers):  # each row's state is the state it reaches alone
        assert len(layer.states) == 3
        for row_state, row_cache in zip(layer.states, alone):
            expected = row_cache.layers[layer_idx].states[0]
            assert (row_state.seen, row_state.covered) == (expected.seen, expected.covered)
            for got, want in zip(row_state.tensors(), expected.tensors()):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_padded_continuation_of_a_shared_state_matches_each_sequence_alone():
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4,
                       mixer_types=["kvm", "full_attention", "kvm"])
    prefix, new = random_ids(3, 10, seed=6), random_ids(3, 9, seed=7)
    new_mask = torch.ones(3, 9, dtype=torch.long)
    new_mask[1, :4] = 0  # padding inside the batch, after a shared unpadded prefix
    new_mask[2, [0, 1, 2, 4, 5, 6, 7]] = 0
    mask = torch.cat((torch.ones(3, 10, dtype=torch.long), new_mask), dim=1)
    with torch.no_grad():
        cache = output_cache(model(prefix, use_cache=True))
        batched = model(new, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1)[:, 10:], cache=cache).logits
        for row in range(3):
            sequence = torch.cat((prefix[row], new[row][new_mask[row].bool()]))[None]
            alone = model(sequence).logits[0, 10:]
            torch.testing.assert_close(batched[row][new_mask[row].bool()], alone, atol=1e-5, rtol=0)


def window_tokens(length, chunk, window_chunks):
    return length - max(0, math.ceil(length / chunk) * chunk - window_chunks * chunk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_equal_the_window_plus_state_formula(dtype):
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4).to(dtype)
    ids = random_ids(3, 41)
    config = model.config
    per_row = config.num_key_value_heads * (2 * config.head_dim + 1)  # keys, values, radius or gate
    with torch.no_grad():
        cache = None
        for start, end in ((0, 9), (9, 10), (10, 27), (27, 28), (28, 41)):
            cache = output_cache(model(ids[:, start:end], cache=cache, use_cache=True))
            for layer in cache.layers:  # fixed 4-slot float32 state once the first chunk is complete; window in dtype
                window_bytes = window_tokens(end, 4, 2) * per_row * torch.finfo(dtype).bits // 8
                assert layer.nbytes() == 3 * (window_bytes + min(end, 4) * per_row * 4)
    assert cache.get_seq_length() == 41


def test_diagnostics_report_temperatures_gates_and_state():
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_schedule="power_law", kvm_growth_factor=2.0,
                       kvm_state_min_slots=4, kvm_state_max_chunks=100)
    assert set(model.valuearch_diagnostics()["model.layers.0.self_attn.sequence_mixer"]) == {
        "state_temperature", "window_temperature", "merge_gate_weight_norm"}
    with torch.no_grad():
        model(random_ids(2, 64))
    report = model.valuearch_diagnostics()["model.layers.0.self_attn.sequence_mixer"]
    assert report["state_temperature"] == [1.0] * 4 and report["window_temperature"] == [1.0] * 4
    assert len(report["merge_gate_weight_norm"]) == 2
    # last update: chunk [52, 56) leaves the window at T = 60: floor(2 * sqrt(60)) = 15 slots
    assert report["state_slots"] == [15] and report["window_tokens"] == [8] and report["tokens_in_state"] == [56]
    ids, mask = left_pad([random_ids(1, 64), random_ids(1, 9)])
    with torch.no_grad():
        model(ids, attention_mask=mask)
    report = model.valuearch_diagnostics()["model.layers.1.self_attn.sequence_mixer"]
    assert report["state_slots"] == [15, 4] and report["window_tokens"] == [8, 5] and report["tokens_in_state"] == [56, 4]


def test_save_and_load(tmp_path):  # loading through remote code: tests/test_remote_code.py (every model type)
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "kvm.py").exists()  # carried for trust_remote_code
    ids = random_ids(1, 24)
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits, model(ids).logits)


def test_convert_script_turns_a_llama_checkpoint_into_kvm(tmp_path, caplog):
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    llama.save_pretrained(tmp_path / "llama")
    with caplog.at_level(logging.WARNING):
        convert_checkpoint(tmp_path / "llama", tmp_path / "kvm", "kvm")  # scripts/convert.py --to kvm
    assert "needs continued training" in caplog.text
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "kvm").eval()
    assert converted.config.model_type == "kvm" and converted.config.kvm_window_chunks * converted.config.kvm_chunk_size == 512
    ids = random_ids(2, 40)
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, llama(ids).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("source_class", ["llama", "valuearch"])
def test_llama_conversion_is_exact_within_the_window(source_class, caplog):
    torch.manual_seed(0)
    if source_class == "llama":
        source = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    else:
        source = ValueArchForCausalLM(ValueArchConfig(**TINY, tie_word_embeddings=True)).eval()
    with caplog.at_level(logging.WARNING):
        converted = llama_to_kvm(source, kvm_chunk_size=16, kvm_state_min_slots=16)
    assert "differs from its source there and needs continued training" in caplog.text
    assert converted.config.model_type == "kvm" and not converted.config.kvm_zero_state_rope
    assert converted.config.rotary_dim == converted.config.head_dim and converted.config.qk_norm == "none"
    with torch.no_grad():
        ids = random_ids(2, 32)  # the window: 2 chunks of 16
        torch.testing.assert_close(converted(ids).logits, source(ids).logits, atol=1e-6, rtol=0)
        ids = random_ids(2, 64)
        assert (converted(ids).logits - source(ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("value_path_type", ["bov", "resformer", "satformer"])
def test_kvm_layers_compose_with_value_paths(value_path_type):
    model = tiny_model(value_path_type, mixer_types=["kvm"] * 3, kvm_chunk_size=4, kvm_state_min_slots=4,
                       partial_rotary_factor=0.5)
    prefill, decoded = prefill_then_decode(model, random_ids(2, 40), 13)
    torch.testing.assert_close(decoded, prefill, atol=1e-5, rtol=0)
