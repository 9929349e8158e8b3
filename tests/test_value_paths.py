"""Value paths (spec_value_paths.md): config validation, each formula on a hand-computable case, presets."""

import pytest
import torch
from torch import nn
from transformers import initialization as init

from hf_valuearch import MODEL_TYPES, BovConfig, ResFormerConfig, SatFormerConfig, force_v1_gates
from hf_valuearch.value_paths import ValueContext, build_value_path, token_x0
from tests.common import counting_layer_runs, random_ids, tiny_config, tiny_model

# --- config -----------------------------------------------------------------------------------------------


def test_layer_sets_follow_the_papers():
    def layers(n, value_layers, source="x0"):
        return tiny_config(num_hidden_layers=n, value_source=source, value_layers=value_layers).value_layer_indices

    assert layers(12, "last_third") == [8, 9, 10, 11]  # BoV d12
    assert layers(24, "last_third") == list(range(16, 24))  # BoV d24
    assert layers(12, "every_other") == [1, 3, 5, 7, 9, 11]  # nanochat has_ve: last layer included
    assert layers(3, "every_other") == [0, 2]
    assert layers(3, "every_other", "v1") == [2]  # layer 0 produces V1
    assert layers(4, "all", "v1") == [1, 2, 3]
    assert layers(4, [3, 1]) == [1, 3]
    assert tiny_config().value_layer_indices == []


@pytest.mark.parametrize("overrides, field", [
    (dict(value_source="values"), "value_source"),
    (dict(value_source="table"), "value_layers"),  # a non-residual source needs a layer set
    (dict(value_mix="add"), "value_mix"),  # mixing fields set on the standard path
    (dict(value_coefficients="learnable"), "value_coefficients"),
    (dict(value_coefficient_init=[2.0]), "value_coefficient_init"),
    (dict(value_source="x0", value_layers="first_half"), "value_layers"),
    (dict(value_source="x0", value_layers=[1, 3]), "value_layers"),  # 3 layers: index 3 out of range
    (dict(value_source="x0", value_layers=[1, 1]), "value_layers"),
    (dict(value_source="x0", value_layers=[]), "value_layers"),
    (dict(value_source="v1", value_layers=[0, 2]), "value_layers"),  # layer 0 cannot read V1
    (dict(value_source="v1", value_layers=[0], num_hidden_layers=1), "value_layers"),
    (dict(value_source="residual", value_layers="all"), "value_coefficients"),  # fixed gamma * V = rescaled W_V
    (dict(value_source="residual", value_layers="all", value_mix="add"), "value_mix"),  # alpha V + beta V
    (dict(value_source="x0", value_layers="all", value_mix="relu_gate", value_coefficients="learnable"), "value_mix"),
    (dict(value_source="v1", value_layers="all", value_mix="relu_gate"), "value_coefficients"),
    (dict(value_source="v1", value_layers="all", value_mix="relu_gate", value_coefficients="learnable",
          value_coefficient_init=[1.0]), "value_coefficient_init"),
    (dict(value_source="x0", value_layers="all", value_coefficient_init=[1.0, 0.0]), "value_coefficient_init"),
    (dict(value_source="x0", value_layers="all", value_mix="add", value_coefficient_init=[1.0]),
     "value_coefficient_init"),
    (dict(value_source="x0", value_layers="all", value_coefficient_init=[float("nan")]), "value_coefficient_init"),
])
def test_invalid_value_paths_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"ValueArchConfig\.{field}="):
        tiny_config(**overrides)


def test_presets_carry_the_papers_defaults():
    bov, resformer, satformer = BovConfig(), ResFormerConfig(), SatFormerConfig()
    assert (bov.value_source, bov.value_mix, bov.value_coefficients, bov.value_layers) == (
        "table", "substitute", "learnable", "last_third")
    assert bov.value_coefficient_values == [1.0]
    assert (resformer.value_source, resformer.value_mix, resformer.value_coefficients) == ("v1", "add", "fixed")
    assert resformer.value_coefficient_values == [0.5, 0.5] and resformer.value_layer_indices == list(range(1, 32))
    assert (satformer.value_source, satformer.value_mix, satformer.value_layers) == ("v1", "relu_gate", "all")
    assert satformer.qk_norm == "rmsnorm" and satformer.tie_word_embeddings
    assert BovConfig.from_dict(bov.to_dict()).value_layers == "last_third"


# --- formulas on hand-computable cases --------------------------------------------------------------------


def identity_v_proj(size: int = 4) -> nn.Linear:
    v_proj = nn.Linear(size, size, bias=False)
    nn.init.eye_(v_proj.weight)
    return v_proj


def path_config(**overrides):
    return tiny_config(**{**dict(vocab_size=5, hidden_size=4, intermediate_size=8, num_hidden_layers=2,
                                 num_attention_heads=1, num_key_value_heads=1, pad_token_id=None,
                                 rms_norm_eps=1e-12), **overrides})


def test_table_substitute_is_gamma_times_table_row():
    path = build_value_path(path_config(value_source="table", value_layers=[1], value_coefficients="learnable",
                                        value_coefficient_init=[2.0]), 1)
    path.init_valuearch_weights(init)
    with torch.no_grad():
        path.value_table.weight.copy_(torch.arange(20.0).view(5, 4))
    values = path(torch.zeros(1, 2, 4), identity_v_proj(), ValueContext(token_ids=torch.tensor([[3, 1]])))
    expected = 2 * torch.tensor([[[12.0, 13, 14, 15]], [[4.0, 5, 6, 7]]])  # [T, H_kv, D]
    assert torch.equal(values[0], expected)
    assert path.diagnostics() == {"value_scale": 2.0}


def test_x0_substitute_projects_the_normed_embedding():
    path = build_value_path(path_config(value_source="x0", value_layers=[1]), 1)
    x0 = torch.tensor([[[3.0, 4.0, 0.0, 0.0]]]) / (25.0 / 4) ** 0.5  # RMSNorm([3, 4, 0, 0]) = [1.2, 1.6, 0, 0]
    values = path(torch.randn(1, 1, 4), identity_v_proj(), ValueContext(x0=x0))
    assert torch.allclose(values.flatten(), torch.tensor([1.2, 1.6, 0.0, 0.0]))
    assert path.diagnostics() == {"value_scale": 1.0}  # fixed coefficients are reported too


def test_add_mixes_alpha_v_plus_beta_v1():
    path = build_value_path(path_config(value_source="v1", value_layers=[1], value_mix="add",
                                        value_coefficient_init=[0.25, 2.0]), 1)
    h = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    v1 = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 1, 4)
    values = path(h, identity_v_proj(), ValueContext(v1=v1))
    assert torch.equal(values.flatten(), torch.tensor([2.25, 0.5, 0.75, 1.0]))  # 0.25 * h + 2 * V1
    assert path.diagnostics() == {"residual_scale": 0.25, "source_scale": 2.0}


def test_residual_scale_is_gamma_times_v():
    path = build_value_path(path_config(value_layers=[1], value_coefficients="learnable",
                                        value_coefficient_init=[3.0]), 1)
    path.init_valuearch_weights(init)
    h = torch.tensor([[[1.0, -2.0, 0.5, 0.0]]])
    assert torch.equal(path(h, identity_v_proj(), ValueContext()).flatten(), 3 * h.flatten())


def test_first_layer_hands_on_its_raw_values_as_v1():
    config = path_config(value_source="v1", value_layers="all")
    context = ValueContext()
    h = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    values = build_value_path(config, 0)(h, identity_v_proj(), context)
    assert torch.equal(values.flatten(), h.flatten()) and context.v1 is values


def test_relu_gate_per_token_and_kv_head():
    config = path_config(num_attention_heads=2, num_key_value_heads=2, value_source="v1", value_layers=[1],
                         value_mix="relu_gate", value_coefficients="learnable")
    path = build_value_path(config, 1)
    with torch.no_grad():
        path.v1_gate.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]))  # gate logits [h0, -h0]
    h = torch.tensor([[[2.0, 1.0, 0.0, 0.0]]])  # gates ReLU([2, -2]) = [2, 0]
    v1 = torch.ones(1, 1, 2, 2)
    values = path(h, identity_v_proj(), ValueContext(v1=v1))  # V = [[2, 1], [0, 0]] per head
    assert torch.equal(values[0, 0], torch.tensor([[4.0, 3.0], [0.0, 0.0]]))
    assert path.diagnostics() == {"v1_gate_mean": [2.0, 0.0], "v1_gate_zero_fraction": [0.0, 1.0]}


def test_table_layers_hold_no_w_v():
    model = tiny_model("bov")
    assert "model.layers.2.self_attn.v_proj.weight" not in model.state_dict()
    ids = random_ids(1, 5)
    model(ids).logits.sum().backward()
    assert model.model.layers[1].self_attn.v_proj.weight.grad is not None
    assert model.model.layers[2].self_attn.value_path.value_table.weight.grad is not None


def test_svformer_style_v1_substitution_uses_layer_0_values_everywhere():
    """V1 substitution in all layers (gamma = 1) equals a standard model whose later W_V outputs are replaced by
    layer 0's, the SVFormer construction (Zhou et al., arXiv:2410.17897 §3)."""
    svformer = tiny_model(value_source="v1", value_layers="all")
    standard = tiny_model()
    assert all(layer.self_attn.v_proj is None for layer in svformer.model.layers[1:])  # SVFormer: no W_V there
    standard.load_state_dict(svformer.state_dict(), strict=False)
    captured = {}
    standard.model.layers[0].self_attn.v_proj.register_forward_hook(lambda m, i, o: captured.update(v1=o))
    for layer in standard.model.layers[1:]:
        layer.self_attn.v_proj.register_forward_hook(lambda m, i, o: captured["v1"])
    ids = random_ids(2, 6)
    assert torch.allclose(svformer(ids).logits, standard(ids).logits, atol=1e-6)


# --- model-level behaviour --------------------------------------------------------------------------------


def test_table_model_rejects_inputs_embeds_and_ids_outside_the_tables():
    model = tiny_model("bov")
    ids = random_ids(1, 4)
    with pytest.raises(ValueError, match="input_ids, not inputs_embeds"):
        model(inputs_embeds=model.model.embed_tokens(ids))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[5, 97]]))
    model.resize_token_embeddings(120)  # the tables grow with the vocabulary
    assert model(torch.tensor([[5, 119]])).logits.shape == (1, 2, 120)


def test_other_value_paths_accept_inputs_embeds():
    model = tiny_model("satformer")
    ids = random_ids(2, 5)
    assert torch.allclose(model(inputs_embeds=model.model.embed_tokens(ids)).logits, model(ids).logits)


def test_diagnostics_report_coefficients_and_gate_statistics_per_layer():
    bov = tiny_model("bov", num_hidden_layers=4)
    with torch.no_grad():
        bov.model.layers[3].self_attn.value_path.value_scale.fill_(10.5)
    assert bov.valuearch_diagnostics() == {"model.layers.2.self_attn.value_path": {"value_scale": 1.0},
                                           "model.layers.3.self_attn.value_path": {"value_scale": 10.5}}
    resformer = tiny_model("resformer", value_coefficients="learnable")
    assert resformer.valuearch_diagnostics()["model.layers.1.self_attn.value_path"] == {
        "residual_scale": 0.5, "source_scale": 0.5}

    satformer = tiny_model("satformer")
    assert not any(satformer.valuearch_diagnostics().values())  # nothing recorded before a forward
    satformer(random_ids(2, 16))
    stats = {name: d for name, d in satformer.valuearch_diagnostics().items() if d}
    assert sorted(stats) == ["model.layers.1.self_attn.value_path", "model.layers.2.self_attn.value_path"]
    for layer_stats in stats.values():
        assert len(layer_stats["v1_gate_mean"]) == 2 and len(layer_stats["v1_gate_zero_fraction"]) == 2  # KV heads
        assert all(0 < f < 1 for f in layer_stats["v1_gate_zero_fraction"])  # N(0, 0.02) init: about half open
        assert all(m > 0 for m in layer_stats["v1_gate_mean"])


def test_gate_interventions_force_zero_and_mean():
    model = tiny_model("satformer")
    ids = random_ids(2, 8)
    logits = model(ids).logits
    paths = [layer.self_attn.value_path for layer in model.model.layers[1:]]

    closed = tiny_model("satformer")
    with torch.no_grad():
        for layer in closed.model.layers[1:]:
            layer.self_attn.value_path.v1_gate.weight.zero_()
    with force_v1_gates(model, "zero"):
        assert torch.allclose(model(ids).logits, closed(ids).logits, atol=1e-6)

    seen = []

    def check_mean_gate(module, args, output):
        value_input, v_proj, context = args
        values = v_proj(value_input).view_as(output)
        seen.append(torch.allclose(output, values + module.gate_override[:, None] * context.v1, atol=1e-6))

    model(ids)  # the unforced statistics that "mean" uses
    means = [p.last_gate_mean.clone() for p in paths]
    handles = [p.register_forward_hook(check_mean_gate) for p in paths]
    with force_v1_gates(model, "mean"):
        assert all(torch.equal(p.gate_override, m) for p, m in zip(paths, means))
        model(ids)
    assert seen == [True, True]
    for handle in handles:
        handle.remove()
    assert all(p.gate_override is None for p in paths)
    assert torch.equal(model(ids).logits, logits)  # the intervention is undone on exit

    with pytest.raises(ValueError, match="mode='sometimes'"):
        with force_v1_gates(model, "sometimes"):
            pass
    with pytest.raises(ValueError, match="forward pass first"):
        with force_v1_gates(tiny_model("satformer"), "mean"):
            pass
    with pytest.raises(ValueError, match="SATFormer gates"):
        with force_v1_gates(tiny_model("bov"), "zero"):
            pass


def test_gradient_checkpointing_gives_the_same_gradients():
    ids = random_ids(2, 10)
    for model_type, overrides in (("satformer", {}), ("bov", {}), ("resformer", {"value_coefficients": "learnable"}),
                                  ("valuearch", {"value_source": "x0", "value_layers": "every_other",
                                                 "value_coefficients": "learnable"})):
        grads = []
        for checkpointing in (False, True):
            model = tiny_model(model_type, **overrides).train()
            if checkpointing:
                model.gradient_checkpointing_enable()
            with counting_layer_runs(model) as runs:
                model(ids, labels=ids).loss.backward()
            assert runs == [2 if checkpointing else 1] * model.config.num_hidden_layers  # the recompute happened
            grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        assert grads[0].keys() == grads[1].keys()
        assert any("value_path" in name for name in grads[0]), model_type
        for name in grads[0]:
            assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), (model_type, name)


def fitted_value_projection(model, layer_idx: int) -> torch.Tensor:
    """The W_V [kv_dim, D] with E_V = RMSNorm(e) W_V^T by least squares, and its largest residual."""
    x0 = token_x0(model.model.embed_tokens.weight.detach(), model.config.rms_norm_eps).double()
    table = model.model.layers[layer_idx].self_attn.value_path.value_table.weight.detach().double()
    fit = torch.linalg.lstsq(x0, table).solution
    return fit.T.float(), float((x0 @ fit - table).abs().max())


def test_fresh_bov_equals_the_x0_substitutive_model_at_step_0(tmp_path):
    """BoV §4 aligned init: E_V[t] = W_V RMSNorm(e[t]), so step 0 equals the x0 W_V substitution (with the W_V the
    table was aligned with; table layers keep none)."""
    bov = tiny_model("bov", num_hidden_layers=4)
    x0_model = tiny_model(num_hidden_layers=4, value_source="x0", value_layers="last_third",
                          value_coefficients="learnable")
    x0_model.load_state_dict(bov.state_dict(), strict=False)  # everything but the tables and W_V of layers 2, 3
    for layer_idx in (2, 3):
        projection, residual = fitted_value_projection(bov, layer_idx)
        assert residual < 1e-5
        with torch.no_grad():
            x0_model.model.layers[layer_idx].self_attn.v_proj.weight.copy_(projection)
    ids = random_ids(2, 8)
    assert torch.allclose(bov(ids).logits, x0_model(ids).logits, atol=1e-5)

    with torch.no_grad():  # a trained table is loaded as saved, not re-aligned
        bov.model.layers[3].self_attn.value_path.value_table.weight.mul_(3.0)
    bov.save_pretrained(tmp_path)
    reloaded = type(bov).from_pretrained(tmp_path)
    assert torch.equal(reloaded.model.layers[3].self_attn.value_path.value_table.weight,
                       bov.model.layers[3].self_attn.value_path.value_table.weight)


def test_checkpoints_with_w_v_at_table_layers_load_without_it(tmp_path):
    """An x0 W_V checkpoint loaded as BoV: W_V of the table layer is skipped, the missing table is aligned to the
    loaded embeddings (conversion with the checkpoint's own W_V: `to_bov`)."""
    x0_model = tiny_model(value_source="x0", value_layers="last_third", value_coefficients="learnable")
    x0_model.save_pretrained(tmp_path)
    config = BovConfig(**{k: v for k, v in x0_model.config.to_dict().items() if k in BovConfig().to_dict()
                          and not k.startswith("value_") and k not in ("model_type", "architectures", "auto_map")})
    bov = MODEL_TYPES["bov"][2].from_pretrained(tmp_path, config=config).eval()
    assert bov.model.layers[2].self_attn.v_proj is None
    assert torch.equal(bov.model.layers[1].self_attn.v_proj.weight, x0_model.model.layers[1].self_attn.v_proj.weight)
    assert fitted_value_projection(bov, 2)[1] < 1e-5
