"""Block AttnRes / RD-AttnRes: the depth softmax, the block schedule, the equivalences, diagnostics, configs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_valuearch import MODEL_TYPES
from hf_valuearch.depth_routing import (
    depth_read,
    depth_route_report,
    jensen_shannon,
    record_depth_routes,
)
from hf_valuearch.modeling_valuearch import ValueArchRMSNorm
from tests.common import random_ids, tiny_config, tiny_model

VALUE_ROUTES = ("learned", "tied", "average", "frozen")
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "depth_routing"


def naive_depth_read(values, query, key_norm_weight, eps):
    """The spec's drop-in reference (Kimi Eq. 2-3): softmax_j(w · RMSNorm(v_j)) by autograd, float32 or wider."""
    dtype = torch.promote_types(values[0].dtype, torch.float32)
    stacked = torch.stack([v.to(dtype) for v in values])  # [n, B, T, D]
    keys = stacked * torch.rsqrt(stacked.pow(2).mean(-1, keepdim=True) + eps) * key_norm_weight.to(dtype)
    alpha = (keys @ query.to(dtype)).softmax(0)  # [n, B, T]
    return (alpha.unsqueeze(-1) * stacked).sum(0).to(values[0].dtype)


def key_norm(weight, eps):
    """What depth_read uses of a key RMSNorm (DepthKeyRMSNorm): its weight and epsilon."""
    return SimpleNamespace(weight=weight, eps=eps)


def rms_norm(hidden_states, norm):
    """`norm`'s RMSNorm in the input's own precision (ValueArchRMSNorm computes in float32, as Llama does)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return norm.weight * hidden_states * torch.rsqrt(variance + norm.variance_epsilon)


def randomize_routes(model, seed=0, scale=1.0):
    """Give every pseudo-query and key-norm weight random values, so the depth weights are far from uniform."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "route_query" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
            elif "route_key_norm" in name:
                parameter.copy_(1 + 0.3 * torch.randn(parameter.shape, generator=generator))
    return model


# --- the depth read ------------------------------------------------------------------------------------


def test_depth_read_hand_computed():
    # v0 = [1, 1] -> RMSNorm [1, 1]; v1 = [2, 0] -> RMSNorm [√2, 0]; q = [1, 0]: logits 1, √2.
    values = [torch.tensor([[[1.0, 1.0]]]), torch.tensor([[[2.0, 0.0]]])]
    output_norm = ValueArchRMSNorm(2, eps=0.0)
    with torch.no_grad():
        output_norm.weight.copy_(torch.tensor([1.0, 3.0]))
    unit_keys = key_norm(torch.ones(2), 0.0)
    out, alpha = depth_read(values, torch.tensor([[1.0, 0.0]]), unit_keys, output_norm)
    a1 = 1 / (1 + math.exp(1 - math.sqrt(2)))
    torch.testing.assert_close(alpha[:, 0, 0, 0], torch.tensor([1 - a1, a1]))
    mixed = torch.tensor([(1 - a1) + 2 * a1, 1 - a1])  # then the reading sublayer's RMSNorm, weight [1, 3]
    torch.testing.assert_close(out[0][0, 0], mixed / mixed.square().mean().sqrt() * torch.tensor([1.0, 3.0]))
    # a zero query is a uniform mean; no 1/sqrt(d) scaling: doubling q doubles the logits.
    out, _ = depth_read(values, torch.zeros(1, 2), unit_keys, output_norm)
    mean = torch.tensor([1.5, 0.5])
    torch.testing.assert_close(out[0][0, 0], mean / mean.square().mean().sqrt() * torch.tensor([1.0, 3.0]))
    _, alpha2 = depth_read(values, torch.tensor([[2.0, 0.0]]), unit_keys, output_norm)
    a2 = 1 / (1 + math.exp(2 - 2 * math.sqrt(2)))
    torch.testing.assert_close(alpha2[1, 0, 0, 0], torch.tensor(a2))


def float64_norm(hidden_size, generator):
    norm = ValueArchRMSNorm(hidden_size, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(hidden_size, generator=generator, dtype=torch.float64))
    return norm


@pytest.mark.parametrize("num_queries, average", [(1, False), (2, False), (2, True)])
def test_depth_read_gradcheck(num_queries, average):
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(2, 3, 5, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    queries = torch.randn(num_queries, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    key_weight = (1 + 0.3 * torch.randn(5, generator=generator, dtype=torch.float64)).requires_grad_()
    norm_weight = float64_norm(5, generator).weight.detach().requires_grad_()

    def read(queries, key_weight, norm_weight, *values):
        output_norm = SimpleNamespace(weight=norm_weight, variance_epsilon=1e-5)  # what depth_read uses
        return tuple(depth_read(list(values), queries, key_norm(key_weight, 1e-6), output_norm, average)[0])

    assert torch.autograd.gradcheck(read, (queries, key_weight, norm_weight, *values), eps=1e-6, atol=1e-7)


def test_depth_read_matches_naive_formula():
    """The fused read equals RMSNorm(naive depth mixture), values and gradients (float64)."""
    generator = torch.Generator().manual_seed(1)
    values = [torch.randn(2, 4, 16, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    route_query = torch.randn(16, generator=generator, dtype=torch.float64, requires_grad=True)
    key_norm_weight = (1 + 0.2 * torch.randn(16, generator=generator, dtype=torch.float64)).requires_grad_()
    output_norm = float64_norm(16, generator)
    grad_output = torch.randn(2, 4, 16, generator=generator, dtype=torch.float64)
    inputs = [*values, route_query, key_norm_weight, output_norm.weight]

    def gradients(read):
        output = read()
        return [output, *torch.autograd.grad(output, inputs, grad_output)]

    fused = gradients(lambda: depth_read(values, route_query[None], key_norm(key_norm_weight, 1e-6), output_norm)[0][0])
    naive = gradients(lambda: rms_norm(naive_depth_read(values, route_query, key_norm_weight, 1e-6), output_norm))
    for got, expected in zip(fused, naive):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_depth_read_saves_no_float32_copies():
    """Backward keeps the bf16 values by reference plus per-token float32 statistics and the bf16 outputs."""
    values = [torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    queries = torch.zeros(2, 64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        depth_read(values, queries, key_norm(torch.ones(64, dtype=torch.bfloat16), 1e-6),
                   ValueArchRMSNorm(64).to(torch.bfloat16))
    large_float32 = [t for t in saved if t.dtype == torch.float32 and t.numel() >= 2 * 8 * 64]
    assert not large_float32
    assert sum(any(t is v for t in saved) for v in values) == 3


def test_depth_read_bf16_parameters_within_rounding_of_float64():
    """bf16 pseudo-query, key-norm weight and values: the query folds with the key-norm weight in float32, so the
    read stays within bf16 output rounding of the float64 formula (folding in bf16 is ~10x off, issue 11)."""
    generator = torch.Generator().manual_seed(0)
    hidden_size = 256
    values = [(torch.randn(2, 32, hidden_size, generator=generator) * (1 + j)).to(torch.bfloat16) for j in range(6)]
    query = torch.randn(hidden_size, generator=generator).to(torch.bfloat16)
    key_weight = (1 + 0.5 * torch.randn(hidden_size, generator=generator)).to(torch.bfloat16)
    norm = ValueArchRMSNorm(hidden_size).to(torch.bfloat16)
    stacked = torch.stack(values).double()
    keys = stacked * torch.rsqrt(stacked.pow(2).mean(-1, keepdim=True) + 1e-6) * key_weight.double()
    mixed = ((keys @ query.double()).softmax(0).unsqueeze(-1) * stacked).sum(0)
    expected = mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)

    def relative_error(read):
        return ((read.double() - expected).norm(dim=-1) / expected.norm(dim=-1)).max()

    out, _ = depth_read(values, query[None], key_norm(key_weight, 1e-6), norm)
    assert relative_error(out[0]) <= 4e-3  # two bf16 roundings (2^-9 each)
    folded_in_bf16, _ = depth_read(values, (query * key_weight)[None], key_norm(torch.ones_like(key_weight), 1e-6), norm)
    assert relative_error(folded_in_bf16[0]) > 1e-2


# --- the block schedule --------------------------------------------------------------------------------


def reference_logits(model, input_ids):
    """Megatron's schedule written out (spec §1.3 drop-in): sources=[], partial=embedding; a sublayer whose
    index is a multiple of the block size first appends the partial sum and reads only the sources."""
    base, config = model.model, model.config
    block_size, eps = config.attnres_block_size, config.rms_norm_eps
    embeddings = base.embed_tokens(input_ids)
    position_ids = torch.arange(input_ids.shape[1])[None]
    position_embeddings = base.rotary_emb(embeddings, position_ids)
    sources, partial, sublayer = [], embeddings, 0

    def start_sublayer():
        nonlocal sources, partial
        if sublayer % block_size == 0:
            sources, partial = sources + [partial], None
        return sources + ([partial] if partial is not None else [])

    for layer in base.layers:
        router = layer.router
        visible = start_sublayer()
        qk_input = naive_depth_read(visible, router.attn_route_query, router.attn_route_key_norm.weight, eps)
        value_query = {
            "learned": getattr(router, "value_route_query", None),
            "tied": router.attn_route_query,
            "frozen": torch.zeros_like(router.attn_route_query),
            None: router.attn_route_query,
        }.get(config.value_route)
        if config.value_route == "average":
            value_query = router.value_route_query
        value_input = naive_depth_read(visible, value_query, router.attn_route_key_norm.weight, eps)
        if config.value_route == "average":  # both routes run; ½(h_QK + h_V) feeds Q, K and V
            qk_input = value_input = (qk_input + value_input) / 2
        output, _ = layer.self_attn(
            rms_norm(qk_input, layer.input_layernorm),
            position_embeddings=position_embeddings,
            value_hidden_states=rms_norm(value_input, layer.input_layernorm),
        )
        partial = output if partial is None else partial + output
        sublayer += 1
        visible = start_sublayer()
        mlp_input = naive_depth_read(visible, router.mlp_route_query, router.mlp_route_key_norm.weight, eps)
        output = layer.mlp(rms_norm(mlp_input, layer.post_attention_layernorm))
        partial = output if partial is None else partial + output
        sublayer += 1
    readout = base.readout
    final = naive_depth_read(sources + [partial], readout.final_route_query, readout.final_route_key_norm.weight, eps)
    return model.lm_head(rms_norm(final, base.norm))


@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 7])
def test_block_attnres_follows_megatron_schedule(block_size):
    model = randomize_routes(tiny_model("attnres", attnres_block_size=block_size)).double()
    input_ids = random_ids(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, reference_logits(model, input_ids), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("value_route", VALUE_ROUTES)
def test_rd_attnres_follows_reference(value_route):
    model = randomize_routes(tiny_model("rd_attnres", attnres_block_size=3, value_route=value_route)).double()
    input_ids = random_ids(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, reference_logits(model, input_ids), rtol=1e-9, atol=1e-9)


def test_visible_sources_per_read():
    """Megatron: layer l (1-based, k layers per block) has floor((l-1)/k)+1 completed sources; its attention
    read sees them plus the partial sum unless l starts a block, its MLP read sees them plus the partial
    sum; the final read sees floor((L-1)/k)+2. The embedding is counted once."""
    model = tiny_model("attnres", num_hidden_layers=4, attnres_block_size=4)  # k = 2 transformer layers
    record_depth_routes(model)
    model(random_ids(1, 5))
    layers_per_block = 2
    for l, layer in enumerate(model.model.layers, start=1):
        sources = (l - 1) // layers_per_block + 1
        starts_block = (l - 1) % layers_per_block == 0
        assert layer.router.recorded_routes["attention_qk"].shape[0] == sources + (0 if starts_block else 1)
        assert layer.router.recorded_routes["mlp"].shape[0] == sources + 1
    assert model.model.readout.recorded_routes["final"].shape[0] == (4 - 1) // layers_per_block + 2


# --- equivalences --------------------------------------------------------------------------------------


NANOCHAT_FIELDS = dict(norm_weights=False, embedding_norm=True, smear_gate=True, qk_norm="rmsnorm", qk_scale=1.2)


@pytest.mark.parametrize("model_type,extra", [("attnres", {}), *[("rd_attnres", {"value_route": r}) for r in VALUE_ROUTES],
                                              ("rd_attnres", {"value_route": "learned", **NANOCHAT_FIELDS})])
def test_zero_queries_equal_standard_decoder(model_type, extra):
    """Zero pseudo-queries: every read is h/n and RMSNorm is scale-invariant up to ε, so the logits and the
    hidden states equal the standard decoder's with the same weights. Relative error per norm is at most
    ε (n² - 1) / (2 mean(h²)); with ε = 1e-10 the logits agree to 1e-5 in float32."""
    model = tiny_model(model_type, rms_norm_eps=1e-10, attnres_block_size=2, **extra)
    backbone = {field: value for field, value in extra.items() if field != "value_route"}  # e.g. nanochat's
    standard = tiny_model("valuearch", rms_norm_eps=1e-10, **backbone)
    missing, unexpected = standard.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("route_" in name for name in unexpected)
    input_ids = random_ids(2, 9)
    with torch.no_grad():
        out, expected = model(input_ids, output_hidden_states=True), standard(input_ids, output_hidden_states=True)
    torch.testing.assert_close(out.logits, expected.logits, rtol=1e-5, atol=1e-5)
    for hidden, hidden_expected in zip(out.hidden_states, expected.hidden_states):
        assert hidden.shape == (2, 9, 64)
        torch.testing.assert_close(hidden, hidden_expected, rtol=1e-5, atol=1e-5)


def test_zero_queries_differ_only_by_norm_epsilon():
    """At a finite ε the difference is the predicted ε effect, linear in ε: 100x smaller ε, ~100x smaller."""
    input_ids = random_ids(2, 9)
    differences = []
    for eps in (1e-6, 1e-8):
        model, standard = tiny_model("attnres", rms_norm_eps=eps), tiny_model("valuearch", rms_norm_eps=eps)
        standard.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            differences.append((model(input_ids).logits - standard(input_ids).logits).abs().max().item())
    assert differences[0] > 30 * differences[1]


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["float64", "float32"])
def test_tied_value_route_is_block_attnres(dtype, tolerance):
    """Exact in exact arithmetic: float64 agrees to rounding; in float32 the one- and two-query dot
    products round differently (≤ 1e-5)."""
    attnres = randomize_routes(tiny_model("attnres", attnres_block_size=3)).to(dtype)
    tied = tiny_model("rd_attnres", attnres_block_size=3, value_route="tied").to(dtype)
    tied.load_state_dict(attnres.state_dict())
    input_ids = random_ids(2, 9)
    torch.testing.assert_close(tied(input_ids).logits, attnres(input_ids).logits, rtol=0, atol=tolerance)
    tied(input_ids).logits.square().mean().backward()
    attnres(input_ids).logits.square().mean().backward()
    for (name, p_tied), (_, p_attnres) in zip(tied.named_parameters(), attnres.named_parameters()):
        torch.testing.assert_close(p_tied.grad, p_attnres.grad, rtol=100 * tolerance, atol=tolerance, msg=name)


def test_learned_value_route_equal_to_qk_route_is_block_attnres():
    attnres = randomize_routes(tiny_model("attnres", attnres_block_size=3))
    learned = tiny_model("rd_attnres", attnres_block_size=3)
    learned.load_state_dict(attnres.state_dict(), strict=False)
    input_ids = random_ids(2, 9)
    with torch.no_grad():
        for layer in learned.model.layers:
            layer.router.value_route_query.copy_(layer.router.attn_route_query)
        torch.testing.assert_close(learned(input_ids).logits, attnres(input_ids).logits, rtol=0, atol=1e-5)
        learned.model.layers[1].router.value_route_query.add_(1.0)
        assert (learned(input_ids).logits - attnres(input_ids).logits).abs().max() > 1e-3


def test_average_route_is_mean_of_mixtures():
    """average (spec_attnres.md §4): both routes run with different queries and ½(h_QK + h_V) feeds Q, K and V,
    written out for one read; it is not the read with the mean query (the model with one averaged query)."""
    generator = torch.Generator().manual_seed(3)
    config = tiny_config("rd_attnres", attnres_block_size=2, value_route="average")
    router = randomize_routes(tiny_model("rd_attnres", attnres_block_size=2, value_route="average")).model.layers[1].router
    router = router.double()
    sources = [torch.randn(2, 5, config.hidden_size, generator=generator, dtype=torch.float64) for _ in range(3)]
    norm = float64_norm(config.hidden_size, generator)
    qk_query, value_query, gamma = router.attn_route_query, router.value_route_query, router.attn_route_key_norm.weight
    assert (qk_query - value_query).abs().max() > 0.5

    with torch.no_grad():
        attn_input, value_input = router.read_attention(None, tuple(sources), norm)
        stacked = torch.stack(sources)  # [n, B, T, D]
        keys = stacked * torch.rsqrt(stacked.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) * gamma
        h_qk = ((keys @ qk_query).softmax(0).unsqueeze(-1) * stacked).sum(0)
        h_v = ((keys @ value_query).softmax(0).unsqueeze(-1) * stacked).sum(0)
        expected = rms_norm((h_qk + h_v) / 2, norm)
        mean_query = rms_norm(((keys @ (qk_query + value_query) / 2).softmax(0).unsqueeze(-1) * stacked).sum(0), norm)
    assert value_input is None  # V is projected from the same averaged mixture
    torch.testing.assert_close(attn_input, expected, rtol=1e-12, atol=1e-12)
    assert (attn_input - mean_query).abs().max() > 1e-2


def test_value_route_controls():
    """average: both queries receive gradient; frozen: the V route is a uniform mean while the Q/K route learns."""
    average = randomize_routes(tiny_model("rd_attnres", attnres_block_size=2, value_route="average"))
    input_ids = random_ids(2, 9)
    average(input_ids).logits.sum().backward()
    assert average.model.layers[1].router.value_route_query.grad.abs().sum() > 0
    assert average.model.layers[1].router.attn_route_query.grad.abs().sum() > 0

    frozen = randomize_routes(tiny_model("rd_attnres", attnres_block_size=2, value_route="frozen"))
    assert not any("value_route_query" in name for name, _ in frozen.named_parameters())
    report = depth_route_report(frozen, input_ids)
    for layer in report["layers"]:
        n = len(layer["attention_value"])
        torch.testing.assert_close(torch.tensor(layer["attention_value"]), torch.full((n,), 1 / n))
        assert layer["qk_value_js"] >= 0
    assert report["mean_qk_value_js"] > 1e-3


# --- diagnostics ---------------------------------------------------------------------------------------


def test_jensen_shannon_hand_computed():
    p, q = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    torch.testing.assert_close(jensen_shannon(p, q), torch.tensor(math.log(2)))
    torch.testing.assert_close(jensen_shannon(p, p), torch.tensor(0.0))
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])
    m = (p + q) / 2
    expected = 0.5 * (p * (p / m).log()).sum() + 0.5 * (q * (q / m).log()).sum()
    torch.testing.assert_close(jensen_shannon(p, q), expected)


def test_depth_route_report():
    model = randomize_routes(tiny_model("rd_attnres", attnres_block_size=2))
    input_ids = random_ids(2, 6)
    attention_mask = torch.ones(2, 6, dtype=torch.long)
    attention_mask[1, :2] = 0  # left padding
    report = depth_route_report(model, input_ids, attention_mask)
    assert len(report["layers"]) == 3
    for layer in report["layers"]:
        for route in ("attention_qk", "attention_value", "mlp"):
            assert abs(sum(layer[route]) - 1) < 1e-5
        assert layer["attn_route_query_norm"] > 0 and layer["value_route_query_norm"] > 0
    assert abs(sum(report["final"]["final"]) - 1) < 1e-5
    js = [layer["qk_value_js"] for layer in report["layers"]]
    assert report["mean_qk_value_js"] == pytest.approx(sum(js) / 3) and report["mean_qk_value_js"] > 0
    # recording is off again and the model keeps no per-token state
    assert not model.model.layers[0].router.recorded_routes

    # the JS of the padded tokens does not count: the masked mean equals the mean over real tokens only
    record_depth_routes(model)
    model(input_ids, attention_mask=attention_mask)
    router = model.model.layers[0].router
    per_token = jensen_shannon(router.recorded_routes["attention_qk"], router.recorded_routes["attention_value"])
    real = torch.cat([per_token[0], per_token[1, 2:]])
    assert router.diagnostics(attention_mask)["qk_value_js"] == pytest.approx(real.mean().item(), rel=1e-5)

    with pytest.raises(ValueError, match="depth_routing"):
        depth_route_report(tiny_model("valuearch"), input_ids)
    tied = randomize_routes(tiny_model("rd_attnres", attnres_block_size=2, value_route="tied"))
    assert depth_route_report(tied, input_ids)["mean_qk_value_js"] == pytest.approx(0.0, abs=1e-7)


def test_recording_during_training_keeps_no_graph():
    model = randomize_routes(tiny_model("rd_attnres")).train()
    record_depth_routes(model)
    loss = model(random_ids(2, 6), labels=random_ids(2, 6)).loss
    loss.backward()
    recorded = model.model.layers[2].router.recorded_routes
    assert set(recorded) == {"attention_qk", "attention_value", "mlp"}
    assert all(not alpha.requires_grad for alpha in recorded.values())
    assert model.model.layers[2].router.diagnostics()["qk_value_js"] > 0


# --- configs -------------------------------------------------------------------------------------------


def test_config_validation():
    with pytest.raises(ValueError, match="attnres_block_size=0"):
        tiny_config("attnres", attnres_block_size=0)
    with pytest.raises(ValueError, match="attnres_block_size=4.*only meaningful"):
        tiny_config("valuearch", attnres_block_size=4)
    with pytest.raises(ValueError, match="attnres_block_size=None"):
        tiny_config("valuearch", depth_routing="block_attnres")
    with pytest.raises(ValueError, match="value_route='mixed'.*learned"):
        tiny_config("rd_attnres", value_route="mixed")
    with pytest.raises(ValueError, match="value_route='learned'.*only meaningful"):
        tiny_config("attnres", value_route="learned")
    with pytest.raises(ValueError, match="depth_routing='dense'"):
        tiny_config("valuearch", depth_routing="dense")
    config = tiny_config("rd_attnres")
    assert (config.depth_routing, config.attnres_block_size, config.value_route) == ("rd_attnres", 4, "learned")


EXPECTED_SIZES = {"120m": 120e6, "343m": 343e6}


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.json")), ids=lambda path: path.stem)
def test_config_files_load(path):
    fields = json.loads(path.read_text())
    config_class, _, lm_class = MODEL_TYPES[fields.pop("model_type")]
    config = config_class(**fields)
    with torch.device("meta"):
        model = lm_class(config)
    size = next((s for key, s in EXPECTED_SIZES.items() if key in path.name), None)
    if size is not None:  # within 1.5% of the paper's stated size
        assert abs(sum(p.numel() for p in model.parameters()) - size) / size < 0.015


def test_config_files_present():
    names = {path.name for path in CONFIG_DIR.glob("*.json")}
    for model_type in ("attnres", "rd_attnres"):
        assert {f"{model_type}_{size}.json" for size in ("120m", "343m", "tiny")} <= names
