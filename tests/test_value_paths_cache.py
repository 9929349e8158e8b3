"""Value paths at inference: decode = prefill, table layers cache no values, host-offloaded tables, conversions."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from hf_valuearch import place_value_tables
from hf_valuearch.cache_valuearch import KeysAndTokenIdsLayer, SlidingKeysAndTokenIdsLayer
from hf_valuearch.compat import output_cache
from hf_valuearch.conversion.value_paths import to_bov, to_resformer, to_satformer
from tests.common import TINY, left_pad, prefill_then_decode, random_ids, tiny_model

PRESETS = {
    "bov": ("bov", {}),
    "resformer": ("resformer", {}),
    "resformer_learnable": ("resformer", {"value_coefficients": "learnable"}),
    "satformer": ("satformer", {}),
    "x0_add": ("valuearch", {"value_source": "x0", "value_mix": "add", "value_layers": "last_third"}),
    "bov_sliding": ("bov", {"mixer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                            "sliding_window": 4}),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_decode_equals_prefill(name):
    model_type, overrides = PRESETS[name]
    model = tiny_model(model_type, **overrides)
    full, stepped = prefill_then_decode(model, random_ids(2, 11), 5)
    assert torch.allclose(stepped, full, atol=1e-5)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_generate_with_and_without_cache_left_padded(name):
    model_type, overrides = PRESETS[name]
    model = tiny_model(model_type, **overrides)
    rows = random_ids(2, 7)
    ids, mask = left_pad([rows[0, 3:], rows[1]], pad_id=TINY["pad_token_id"])
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=TINY["pad_token_id"])
    with_cache = model.generate(ids, use_cache=True, **kwargs)
    without_cache = model.generate(ids, use_cache=False, **kwargs)
    assert with_cache.shape == (2, 15) and torch.equal(with_cache, without_cache)


def cache_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def test_table_layers_cache_keys_and_token_ids_only():
    bov = tiny_model("bov", num_hidden_layers=4)  # table layers 2, 3
    baseline = tiny_model("valuearch", num_hidden_layers=4)
    ids = random_ids(3, 10)
    bov_cache = output_cache(bov(ids, use_cache=True))
    baseline_cache = output_cache(baseline(ids, use_cache=True))
    assert [type(layer) for layer in bov_cache.layers[2:]] == [KeysAndTokenIdsLayer] * 2
    assert torch.equal(bov_cache.layers[3].token_ids, ids)
    value_entry_bytes = 3 * 10 * TINY["num_key_value_heads"] * 16 * 4  # B * T * H_kv * head_dim * fp32
    token_id_bytes = 3 * 10 * 8  # B * T * int64
    assert cache_bytes(bov_cache) == cache_bytes(baseline_cache) - 2 * value_entry_bytes + 2 * token_id_bytes


def test_sliding_table_layer_keeps_the_window_of_keys_and_ids():
    model = tiny_model("bov", **PRESETS["bov_sliding"][1])
    ids = random_ids(1, 9)
    layer = output_cache(model(ids, use_cache=True)).layers[2]
    assert isinstance(layer, SlidingKeysAndTokenIdsLayer)
    assert torch.equal(layer.token_ids, ids[:, -3:]) and layer.keys.shape[-2] == 3  # window 4: last 3 kept


class RecordMoves(TorchFunctionMode):
    """Records the shape of every tensor moved with `Tensor.to(device)`."""

    def __init__(self):
        super().__init__()
        self.moved_shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and (isinstance(args[1] if len(args) > 1 else None, (torch.device, str))
                                        or "device" in kwargs):
            self.moved_shapes.append(tuple(args[0].shape))
        return func(*args, **kwargs)


def test_tables_on_another_device_move_only_the_gathered_rows():
    model = tiny_model("bov")
    ids = random_ids(2, 6)
    expected = model(ids).logits
    place_value_tables(model, "cpu")
    with RecordMoves() as moves, torch.no_grad():
        logits = model(ids).logits
    assert torch.allclose(logits, expected)
    kv_dim = TINY["num_key_value_heads"] * 16
    assert (2, 6, kv_dim) in moves.moved_shapes  # the gathered rows E_V[ids]
    assert (TINY["vocab_size"], kv_dim) not in moves.moved_shapes  # never the table


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: model on GPU, tables on the host")
def test_host_offloaded_tables_with_a_gpu_model():
    model = tiny_model("bov").cuda()
    ids = random_ids(2, 6).cuda()
    expected = model(ids).logits
    place_value_tables(model, "cpu")
    assert model.model.layers[2].self_attn.value_path.value_table.weight.device.type == "cpu"
    assert torch.allclose(model(ids).logits, expected, atol=1e-5)
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert generated.shape == (2, 11)


# --- conversions ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def test_llama_to_resformer_and_satformer_start_identical(llama):
    ids = random_ids(2, 9)
    expected = llama(ids).logits
    resformer, satformer = to_resformer(llama), to_satformer(llama)
    assert resformer.config.value_coefficient_values == [1.0, 0.0] and resformer.config.value_coefficients == "learnable"
    assert satformer.config.qk_norm == "none" and satformer.config.tie_word_embeddings  # the source's backbone
    assert torch.equal(resformer(ids).logits, expected)
    assert torch.equal(satformer(ids).logits, expected)
    opened = to_satformer(llama, gate_init_std=0.02)
    assert not torch.allclose(opened(ids).logits, expected)


def test_converted_satformer_gates_open_under_training(llama):
    """Zero gate weights give identical logits, and still get gradient: the gates open as the model trains."""
    satformer = to_satformer(llama).train()
    gates = [layer.self_attn.value_path.v1_gate.weight for layer in satformer.model.layers[1:]]
    optimizer = torch.optim.SGD(gates, lr=1.0)
    ids = random_ids(4, 12)
    for _ in range(3):
        optimizer.zero_grad()
        satformer(ids, labels=ids).loss.backward()
        assert all(gate.grad.abs().sum() > 0 for gate in gates)
        optimizer.step()
    satformer(ids)
    gate_means = [layer.self_attn.value_path.last_gate_mean for layer in satformer.model.layers[1:]]
    assert all((mean > 0).any() for mean in gate_means)


def test_llama_to_bov_starts_from_the_aligned_tables(llama):
    bov = to_bov(llama)
    embeddings = llama.model.embed_tokens.weight
    x0 = embeddings / embeddings.pow(2).mean(-1, keepdim=True).add(llama.config.rms_norm_eps).sqrt()
    table = bov.model.layers[2].self_attn.value_path.value_table.weight  # E_V[t] = W_V RMSNorm(e[t])
    assert torch.allclose(table, x0 @ llama.model.layers[2].self_attn.v_proj.weight.T, atol=1e-6)
    assert bov.config.value_layer_indices == [2]


def test_x0_substitutive_model_converts_to_bov_with_identical_logits():
    x0_model = tiny_model(value_source="x0", value_layers="every_other", value_coefficients="learnable")
    with torch.no_grad():
        x0_model.model.layers[2].self_attn.value_path.value_scale.fill_(3.5)
    bov = to_bov(x0_model)
    assert bov.config.value_layer_indices == [0, 2]
    ids = random_ids(2, 9)
    assert torch.allclose(bov(ids).logits, x0_model(ids).logits, atol=1e-5)


def test_conversions_reject_sources_they_cannot_map():
    satformer = tiny_model("satformer")
    with pytest.raises(ValueError, match="standard value path"):
        to_resformer(satformer)
    with pytest.raises(ValueError, match="x0 W_V-substitutive"):
        to_bov(tiny_model(value_source="x0", value_mix="add", value_layers="all"))


def test_convert_script_to_value_path_architectures(llama, tmp_path):
    from scripts.convert import main as convert_main

    llama.save_pretrained(tmp_path / "llama")
    ids = random_ids(2, 9)
    expected = llama(ids).logits
    for target in ("resformer", "satformer", "bov"):
        convert_main(["--input", str(tmp_path / "llama"), "--output", str(tmp_path / target), "--to", target])
        converted = AutoModelForCausalLM.from_pretrained(tmp_path / target).eval()
        assert converted.config.model_type == target
        if target == "bov":
            assert torch.equal(converted.model.layers[2].self_attn.value_path.value_table.weight,
                               to_bov(llama).model.layers[2].self_attn.value_path.value_table.weight)
        else:
            assert torch.equal(converted(ids).logits, expected)
