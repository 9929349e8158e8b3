"""KVM user paths: config files, padded batches and generate, cache memory, diagnostics, save/load, conversion."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from hf_valuearch import MODEL_TYPES, ValueArchConfig, ValueArchForCausalLM
from hf_valuearch.compat import output_cache
from hf_valuearch.kvm_conversion import llama_to_kvm
from tests.common import TINY, random_ids, tiny_model

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "kvm"


def load_config_file(path: Path):
    """A config JSON of configs/kvm: `model_type` picks the class; keys starting with "_" are comments."""
    fields = {key: value for key, value in json.loads(path.read_text()).items() if not key.startswith("_")}
    return MODEL_TYPES[fields.pop("model_type")][0](**fields)


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_paper_config_files_load(path):
    config = load_config_file(path)
    assert config.head_dim == 128 and config.rotary_dim == 64 and config.kvm_chunk_size == 256
    tiny = load_config_file(CONFIG_DIR / "tiny" / path.name)
    for field in ("kvm_state_schedule", "kvm_head_temperatures", "kvm_merge_gate", "kvm_merge_gate_appends",
                  "kvm_sink_slots", "kvm_readout_radius", "kvm_zero_state_rope"):
        assert getattr(tiny, field) == getattr(config, field)
    assert ("sliding_attention" in tiny.mixer_types) == ("sliding_attention" in config.mixer_types)


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "tiny").glob("*.json")), ids=lambda p: p.stem)
def test_tiny_config_files_build_and_decode_like_prefill(path):
    config = load_config_file(path)
    torch.manual_seed(0)
    model = MODEL_TYPES[config.model_type][2](config).eval()
    mixer = next(layer.self_attn.sequence_mixer for layer in model.model.layers if layer.self_attn.sequence_mixer)
    assert (mixer.state_temperature is not None) == config.kvm_head_temperatures
    assert (mixer.merge_gate_proj is not None) == config.kvm_merge_gate
    ids = random_ids(1, 50)
    with torch.no_grad():
        prefill = model(ids).logits
        out = model(ids[:, :30], use_cache=True)
        cache, logits = output_cache(out), [out.logits]
        for t in range(30, 50):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = output_cache(out)
            logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, dim=1), prefill, atol=1e-5, rtol=0)


def left_padded(sequences):
    length = max(s.shape[1] for s in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, length - sequence.shape[1]:] = sequence[0]
        mask[row, length - sequence.shape[1]:] = 1
    return ids, mask


def test_left_padded_batches_match_each_sequence_alone():
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4,
                       mixer_types=["kvm", "full_attention", "kvm"])
    sequences = [random_ids(1, 30, seed=3), random_ids(1, 19, seed=4), random_ids(1, 7, seed=5)]
    ids, mask = left_padded(sequences)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        for row, sequence in enumerate(sequences):
            alone = model(sequence).logits
            torch.testing.assert_close(batched[row, -sequence.shape[1]:], alone[0], atol=1e-5, rtol=0)
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0)
        for row, sequence in enumerate(sequences):
            alone = model.generate(sequence, max_new_tokens=14, do_sample=False, pad_token_id=0)
            assert generated[row, ids.shape[1]:].tolist() == alone[0, sequence.shape[1]:].tolist()


def window_and_state_rows(length, chunk, window_chunks, slots):
    window_start = max(0, math.ceil(length / chunk) * chunk - window_chunks * chunk)
    return (length - window_start) + slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_equal_the_window_plus_state_formula(dtype):
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4).to(dtype)
    ids = random_ids(3, 41)
    config = model.config
    per_row = config.num_key_value_heads * (2 * config.head_dim + 1) * torch.finfo(dtype).bits // 8
    with torch.no_grad():
        cache = None
        for start, end in ((0, 9), (9, 10), (10, 27), (27, 28), (28, 41)):
            cache = output_cache(model(ids[:, start:end], cache=cache, use_cache=True))
            for layer in cache.layers:  # fixed 4-slot state once the first chunk is complete
                rows = window_and_state_rows(end, 4, 2, slots=min(end, 4))
                assert layer.nbytes() == 3 * rows * per_row
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
    ids, mask = left_padded([random_ids(1, 64), random_ids(1, 9)])
    with torch.no_grad():
        model(ids, attention_mask=mask)
    report = model.valuearch_diagnostics()["model.layers.1.self_attn.sequence_mixer"]
    assert report["state_slots"] == [15, 4] and report["window_tokens"] == [8, 5] and report["tokens_in_state"] == [56, 4]


def test_save_and_load_with_remote_code(tmp_path):
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "kvm.py").exists()
    ids = random_ids(1, 24)
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits, expected)
    torch.save(ids, tmp_path / "ids.pt")
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path = [p for p in sys.path if p not in ("", ".")]
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        logits = model(torch.load({str(tmp_path / "ids.pt")!r})).logits
        torch.testing.assert_close(logits, torch.load({str(tmp_path / "expected.pt")!r}))
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={"HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


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
