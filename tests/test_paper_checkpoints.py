"""Checkpoints written by the papers' own code load exactly (`scripts/convert.py --from FORMAT`).

tests/fixtures/<format>/ holds a tiny random checkpoint in each paper's native format and the logits the paper's
code gave on a probe batch (expected.safetensors); tests/fixtures/README.md says how they were made.
"""

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from hf_valuearch.cache_valuearch import ValueArchCache
from hf_valuearch.compat import output_cache
from hf_valuearch.conversion import FORMATS, convert_paper_checkpoint
from hf_valuearch.conversion.kvm_paper_checkpoints import paper_rotary_permutation
from tests.common import REPO, left_pad, run_script

FIXTURES = REPO / "tests" / "fixtures"
# (format, fixture folder, the model type it converts to)
CASES = [("satformer", "satformer", "satformer"), ("fla-attnres", "fla-attnres", "attnres"),
         ("nanochat", "nanochat/bov", "bov"), ("nanochat", "nanochat/v1_add", "valuearch"),
         ("kvm-paper", "kvm-paper", "kvm")]


def test_every_format_has_a_fixture():
    assert {format_name for format_name, _, _ in CASES} == set(FORMATS)


@pytest.mark.parametrize("format_name, folder, model_type", CASES, ids=[folder for _, folder, _ in CASES])
def test_converted_paper_checkpoint_gives_the_papers_logits(tmp_path, capsys, format_name, folder, model_type):
    source = FIXTURES / folder
    run_script("convert", "--from", format_name, "--input", str(source), "--output", str(tmp_path / "out"),
               "--reference-logits", str(source / "expected.safetensors"))
    printed = capsys.readouterr().out
    reported = float(re.search(r"max \|logit difference\| against the source's logits in \S+: (\S+)", printed).group(1))
    assert "exact by construction: yes" in printed and reported <= 1e-4

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()  # our architecture, from disk
    assert model.config.model_type == model_type
    expected = load_file(source / "expected.safetensors")
    with torch.no_grad():
        logits = model(expected["input_ids"]).logits
    assert logits.dtype == torch.float32
    assert (logits - expected["logits"]).abs().max().item() <= 1e-4


def test_satformer_keeps_its_tied_head_and_gates():
    model = convert_paper_checkpoint("satformer", FIXTURES / "satformer")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    native = load_file(FIXTURES / "satformer" / "model.safetensors")
    gate = model.model.layers[2].self_attn.value_path.v1_gate.weight
    assert torch.equal(gate, native["model.layers.2.attn.value_residual_mixing.alpha_proj.weight"])
    assert model.config.qk_norm == "rmsnorm" and model.config.qk_norm_eps == 1e-5  # fla's RMSNorm default


def test_fla_attnres_keeps_its_pseudo_queries():
    model = convert_paper_checkpoint("fla-attnres", FIXTURES / "fla-attnres")
    native = load_file(FIXTURES / "fla-attnres" / "model.safetensors")
    assert model.config.attnres_block_size == 2 and model.config.sliding_window == 6
    assert torch.equal(model.model.layers[1].router.mlp_route_query, native["model.layers.1.mlp_res_proj.weight"][0])
    assert torch.equal(model.model.readout.final_route_query, native["model.res_proj.weight"][0])


def _edited_copy(tmp_path, format_name, config_changes=None, extra_weight=None):
    directory = tmp_path / format_name
    shutil.copytree(FIXTURES / format_name, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(config_changes or {})
    (directory / "config.json").write_text(json.dumps(config))
    if extra_weight:
        weights = load_file(directory / "model.safetensors")
        weights[extra_weight] = torch.zeros(3)
        save_file(weights, directory / "model.safetensors")
    return directory


@pytest.mark.parametrize("format_name, edit, message", [
    ("satformer", {"config_changes": {"value_residual_gate": "sigmoid"}}, "value_residual_gate='sigmoid'"),
    ("satformer", {"config_changes": {"value_residual_proj_bias": True}}, "value_residual_proj_bias=True"),
    ("satformer", {"config_changes": {"model_type": "transformer"}}, "format 'satformer' reads 'SATFormer'"),
    ("fla-attnres", {"config_changes": {"qkv_bias": True}}, "qkv_bias=True"),
    ("fla-attnres", {"config_changes": {"hidden_act": "powlu"}}, "hidden_act='powlu'"),
    ("fla-attnres", {"extra_weight": "model.layers.0.attn.extra.weight"}, "model.layers.0.attn.extra.weight"),
    ("kvm-paper", {"config_changes": {"use_block_lambdas": 1}}, "use_block_lambdas=1 (x = λ0 x + λ1 x0"),
    ("kvm-paper", {"config_changes": {"alt_layer_every": 2}}, "alt_layer_every=2 (every n-th layer is a 'swa' layer"),
    ("kvm-paper", {"config_changes": {"kvm_value_residual_mode": "rwkv_post_tokenshift"}},
     "kvm_value_residual_mode='rwkv_post_tokenshift' (the value residual's form)"),
    ("kvm-paper", {"config_changes": {"use_tokenshift_ffn": 0}}, "use_tokenshift_ffn=0 (token shift on the MLP"),
], ids=["gate", "gate-bias", "model-type", "qkv-bias", "activation", "unknown-weight", "block-lambdas",
        "hybrid-layers", "value-residual-mode", "token-shift-attention-only"])
def test_unsupported_features_are_named_in_one_line(tmp_path, format_name, edit, message):
    source = _edited_copy(tmp_path, format_name, **edit)
    with pytest.raises(SystemExit) as exit_info:
        run_script("convert", "--from", format_name, "--input", str(source), "--output", str(tmp_path / "out"))
    error = exit_info.value.code
    assert isinstance(error, str) and "\n" not in error and message in error
    assert not (tmp_path / "out").exists()


def test_fla_checkpoint_without_attnres_is_the_standard_decoder(tmp_path):
    """attnres_block_size None: fla's plain transformer, whose weights are the same minus the depth routing."""
    source = _edited_copy(tmp_path, "fla-attnres", {"attnres_block_size": None, "window_size": None})
    weights = {name: tensor for name, tensor in load_file(source / "model.safetensors").items() if "res_" not in name}
    save_file(weights, source / "model.safetensors")
    model = convert_paper_checkpoint("fla-attnres", source)
    assert model.config.model_type == "valuearch" and model.config.depth_routing == "standard"
    assert set(model.config.mixer_types) == {"full_attention"}


def _nanochat_copy(tmp_path, model_type=None, **flags):
    directory = tmp_path / "nanochat"
    directory.mkdir()
    shutil.copy2(FIXTURES / "nanochat" / "bov" / "model_000000.pt", directory)
    meta = json.loads((FIXTURES / "nanochat" / "bov" / "meta_000000.json").read_text())
    meta["model_type"] = model_type or meta["model_type"]
    meta["model_config"].update(flags)
    (directory / "meta_000000.json").write_text(json.dumps(meta))
    return directory


@pytest.mark.parametrize("model_type, flags, message", [
    ("gpt", {}, "model_type 'gpt' (nanochat's gpt.py) is not supported: its per-layer resid_lambdas"),
    (None, {"add_init_res": True}, "add_init_res (x = alpha x + beta x0 before each target block)"),
    (None, {"value_emb_shared": True}, "value_emb_shared (one value table shared by all target layers)"),
], ids=["karpathy-gpt", "add-init-res", "shared-table"])
def test_unsupported_nanochat_models_are_named_in_one_line(tmp_path, model_type, flags, message):
    source = _nanochat_copy(tmp_path, model_type, **flags)
    with pytest.raises(SystemExit) as exit_info:
        run_script("convert", "--from", "nanochat", "--input", str(source), "--output", str(tmp_path / "out"))
    assert "\n" not in exit_info.value.code and message in exit_info.value.code


def test_nanochat_windows_gamma_and_padded_rows():
    """Layer 0 is nanochat's short window (128, 0) = 129 keys; BoV's gamma and table land at layer 2; the rows
    nanochat pads its vocabulary of 60 with (to 64) are dropped."""
    model = convert_paper_checkpoint("nanochat", FIXTURES / "nanochat" / "bov")
    native = torch.load(FIXTURES / "nanochat" / "bov" / "model_000000.pt", weights_only=True)
    assert model.config.mixer_types == ["sliding_attention", "full_attention", "full_attention"]
    assert model.config.sliding_window == 129 and model.config.value_layer_indices == [2]
    value_path = model.model.layers[2].self_attn.value_path
    assert value_path.value_scale.item() == pytest.approx(1.7)
    assert native["value_embeds.2.weight"].shape[0] == 64 and model.config.vocab_size == 60
    assert torch.equal(value_path.value_table.weight, native["value_embeds.2.weight"][:60])


def test_nanochat_v1_add_every_other_layer():
    """BoV's add_init_v with learned alpha, beta on nanochat's has_ve layers (1 and 3 of 4)."""
    model = convert_paper_checkpoint("nanochat", FIXTURES / "nanochat" / "v1_add")
    config = model.config
    assert (config.value_source, config.value_mix, config.value_coefficients) == ("v1", "add", "learnable")
    assert config.value_layer_indices == [1, 3]
    value_path = model.model.layers[3].self_attn.value_path
    assert (value_path.residual_scale.item(), value_path.source_scale.item()) == pytest.approx((0.6, 1.3))


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_empty_or_foreign_folder_is_a_one_line_error(tmp_path, format_name):
    for contents in ({}, {"notes.txt": "not a checkpoint"}):
        source = tmp_path / f"source{len(contents)}"
        source.mkdir()
        for name, text in contents.items():
            (source / name).write_text(text)
        with pytest.raises(SystemExit) as exit_info:
            run_script("convert", "--from", format_name, "--input", str(source), "--output", str(tmp_path / "out"))
        error = exit_info.value.code
        assert isinstance(error, str) and "\n" not in error and str(source) in error
    with pytest.raises(SystemExit) as exit_info:
        run_script("convert", "--from", format_name, "--input", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"))
    assert "is not a directory" in exit_info.value.code


def test_kvm_paper_backbone_fields_and_weight_conventions():
    """The paper's backbone on our fields (residual_scale 0.5 = sublayer_scale); q/k rows permuted per head for the
    rotary layout; layer 0's ineffective value-residual gate dropped."""
    model = convert_paper_checkpoint("kvm-paper", FIXTURES / "kvm-paper")
    native = load_file(FIXTURES / "kvm-paper" / "model.safetensors")
    config = model.config
    assert (config.norm_type, config.embedding_norm, config.token_shift, config.mlp_activation,
            config.sublayer_scale) == ("layernorm", True, True, "relu2", 0.5)
    assert (config.value_source, config.value_mix, config.value_layer_indices) == ("v1", "sigmoid_lerp", [1, 2])
    assert (config.rope_parameters["rope_type"], config.rotary_dim, config.rope_table_dtype) == (
        "linspace", 16, "bfloat16")
    assert (config.kvm_state_schedule, config.kvm_state_max_chunks, config.kvm_readout_dtype) == (
        "power_law", 2, "bfloat16")
    attention = model.model.layers[1].self_attn
    permutation = paper_rotary_permutation(32, 16)
    paper_q = native["transformer.h.1.attn.c_q.weight"].view(2, 32, 64)
    assert torch.equal(attention.q_proj.weight, paper_q[:, permutation].reshape(64, 64))
    paper_k_shift = native["transformer.h.1.attn.x_k"].view(2, 32)
    assert torch.equal(attention.k_token_shift.mix, paper_k_shift[:, permutation].reshape(-1))
    assert torch.equal(attention.o_proj.weight, native["transformer.h.1.attn.c_proj.weight"])
    assert torch.equal(attention.value_path.v1_gate_bias, native["transformer.h.1.attn.v_gate0"].reshape(-1))
    assert "transformer.h.0.attn.v_gate1.weight" in native and not hasattr(model.model.layers[0].self_attn.value_path,
                                                                            "v1_gate_up")


def test_kvm_paper_decode_equals_prefill_with_token_shift_and_left_padding():
    """Token shift carries each layer's last q, k, v and MLP input in the cache: prefill then single-token decode
    gives the full forward's logits, and a left-padded row gives the logits of its tokens alone (its first token
    shifts from nothing, as at a sequence start; positions count from its first token, as `generate` does)."""
    model = convert_paper_checkpoint("kvm-paper", FIXTURES / "kvm-paper")
    ids = load_file(FIXTURES / "kvm-paper" / "expected.safetensors")["input_ids"]  # [2, 40]
    padded, mask = left_pad([ids[0], ids[1, 10:]])  # row 1: 10 pads, then its last 30 tokens
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = [model(ids[:1]).logits[0], model(ids[1:, 10:]).logits[0]]
        out = model(padded[:, :20], attention_mask=mask[:, :20], position_ids=positions[:, :20], use_cache=True)
        steps, cache = [out.logits], output_cache(out)
        assert isinstance(cache, ValueArchCache) and set(cache.token_shift_inputs[2]) == {"q", "k", "v", "mlp"}
        for t in range(20, 40):
            steps.append(model(padded[:, t : t + 1], attention_mask=mask[:, : t + 1],
                               position_ids=positions[:, t : t + 1], cache=cache, use_cache=True).logits)
    stepped = torch.cat(steps, dim=1)
    assert (stepped[0] - alone[0]).abs().max() <= 1e-5
    assert (stepped[1, 10:] - alone[1]).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="token_shift keeps only the last position"):
        cache.crop(30)
