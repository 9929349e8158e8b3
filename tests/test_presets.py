"""Every registered model type is one declaration in presets.py, and everything derived from it exists."""

import re

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hf_valuearch import (MODEL_TYPES, PRESETS, Paper, Preset, ValueArchConfig, configuration_valuearch,
                          modeling_valuearch)
from hf_valuearch.cards import render_model_card
from hf_valuearch.presets import ConversionTarget
from hf_valuearch.configuration_valuearch import preset_config_class
from hf_valuearch.conversion import CONVERTERS, convert
from hf_valuearch.modeling_valuearch import preset_model_classes
from tests.common import TINY, random_ids, tiny_model

ALL_TYPES = sorted(MODEL_TYPES)


def test_registered_types_are_the_presets():
    assert list(MODEL_TYPES) == list(PRESETS)
    assert all(preset.model_type == model_type for model_type, preset in PRESETS.items())


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_preset_paper_and_citation(model_type):
    paper = PRESETS[model_type].paper
    assert paper.title and paper.authors and 2000 < paper.year < 2100
    assert re.fullmatch(r"\d{4}\.\d{4,5}", paper.arxiv)
    citation = paper.citation
    assert citation.startswith("@misc{") and citation.endswith("}")
    assert f"title = {{{paper.title}}}" in citation and f"eprint = {{{paper.arxiv}}}" in citation
    assert citation.count("{") == citation.count("}")


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_preset_classes_are_module_level_and_carry_the_defaults(model_type):
    preset = PRESETS[model_type]
    config_class, model_class, lm_class = MODEL_TYPES[model_type]
    # module-level names: a saved auto_map ("modeling_valuearch.BovForCausalLM") resolves them under remote code
    assert getattr(configuration_valuearch, f"{preset.class_prefix}Config") is config_class
    assert getattr(modeling_valuearch, f"{preset.class_prefix}Model") is model_class
    assert getattr(modeling_valuearch, f"{preset.class_prefix}ForCausalLM") is lm_class
    assert config_class.model_type == model_type
    assert model_class.config_class is config_class and lm_class.config_class is config_class
    assert lm_class.base_model_class is model_class
    config = config_class(**TINY)
    for name, value in preset.defaults.items():
        if isinstance(value, dict):  # e.g. rope_parameters, which the config completes (rope_theta, ...)
            assert value.items() <= getattr(config, name).items(), name
        else:
            assert getattr(config, name) == value, name
    if "default_mixer_type" in preset.defaults:
        assert config.mixer_types == [preset.defaults["default_mixer_type"]] * config.num_hidden_layers
    # fields a preset does not name keep the baseline's defaults
    baseline = ValueArchConfig(**TINY).to_dict()
    differing = {name for name, value in config.to_dict().items() if baseline.get(name) != value}
    assert differing <= set(preset.defaults) | {"model_type", "mixer_types", "rope_parameters"}


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_preset_auto_registration(model_type):
    config_class, model_class, lm_class = MODEL_TYPES[model_type]
    config = AutoConfig.for_model(model_type, **TINY)
    assert type(config) is config_class
    assert type(AutoModel.from_config(config)) is model_class
    assert type(AutoModelForCausalLM.from_config(config)) is lm_class


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_preset_model_card_cites_its_paper(model_type, tmp_path):
    paper = PRESETS[model_type].paper
    tiny_model(model_type).config.save_pretrained(tmp_path)
    card = render_model_card(tmp_path)
    assert paper.title in card and f"arXiv:{paper.arxiv}" in card and paper.citation in card
    assert PRESETS[model_type].mechanism in card


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_preset_conversion_target(model_type):
    """Every preset is a conversion target that turns the standard decoder into a model of that type, keeping the
    weights they share (table layers hold no W_V)."""
    source = tiny_model("valuearch")
    converted = convert(source, model_type)
    assert type(converted) is MODEL_TYPES[model_type][2]
    assert isinstance(CONVERTERS[model_type].exact(source.config), bool) and CONVERTERS[model_type].note
    source_state = source.state_dict()
    kept = [name for name in converted.state_dict() if name in source_state]
    assert "model.embed_tokens.weight" in kept and "model.layers.2.mlp.down_proj.weight" in kept
    for name in kept:
        assert torch.equal(converted.state_dict()[name], source_state[name]), name


def test_a_new_preset_is_one_declaration():
    """A declaration alone yields a config class with its defaults and working model classes."""
    preset = Preset(
        model_type="test_preset", class_prefix="TestPreset", mechanism="a test", summary="x0 values, learnable.",
        paper=Paper(title="A Test", authors=("Doe, Jane",), year=2026, arxiv="2601.00001"),
        conversion=ConversionTarget("hf_valuearch.conversion:to_valuearch", exact=lambda source: True, note=""),
        defaults={"value_source": "x0", "value_coefficients": "learnable", "value_layers": [1, 2],
                  "default_mixer_type": "sliding_attention", "sliding_window": 4},
    )
    config_class = preset_config_class(preset)
    model_class, lm_class = preset_model_classes(config_class)
    assert (config_class.__name__, model_class.__name__, lm_class.__name__) == (
        "TestPresetConfig", "TestPresetModel", "TestPresetForCausalLM")
    config = config_class(**TINY)  # a list default (value_layers) is a dataclass default_factory
    assert config.value_layers == [1, 2] and config.mixer_types == ["sliding_attention"] * 3
    logits = lm_class(config).eval()(random_ids(1, 6)).logits
    assert logits.shape == (1, 6, TINY["vocab_size"]) and torch.isfinite(logits).all()


def test_a_preset_default_must_name_a_config_field():
    preset = Preset(model_type="bad", class_prefix="Bad", mechanism="", summary="",
                    conversion=ConversionTarget("x:y", exact=lambda source: True, note=""),
                    paper=Paper(title="T", authors=("A, B",), year=2026, arxiv="2601.00001"),
                    defaults={"value_sorce": "x0"})
    with pytest.raises(ValueError, match="value_sorce"):
        preset_config_class(preset)


def test_conversion_targets_are_llama_and_the_presets():
    assert set(CONVERTERS) == {"llama", *PRESETS}
