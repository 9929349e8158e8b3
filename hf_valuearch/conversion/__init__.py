"""Checkpoint conversion between transformers' Llama and the hf_valuearch architectures.

`convert(model, target)` returns a new model of architecture `target`. A Llama source is first
converted to the standard `valuearch` decoder (same parameter names, config renamed field by field:
identical logits); each architecture's converter then starts from a standard `valuearch` model.
The targets are "llama" and every preset, whose converter its declaration names (`presets.py`).
`scripts/convert.py` is the command-line front end.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable
from pathlib import Path

from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from .. import MODEL_TYPES, PRESETS
from ..configuration_valuearch import ValueArchConfig
from ..modeling_valuearch import ValueArchForCausalLM
from .common import carried_fields, copy_weights

# Fields that only valuearch has (decoder options and the three axes): all must be at their defaults for Llama.
VALUEARCH_OPTION_FIELDS = sorted(set(ValueArchConfig.__dataclass_fields__) - set(LlamaConfig.__dataclass_fields__))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja")


def llama_to_valuearch(model: LlamaForCausalLM) -> ValueArchForCausalLM:
    """Llama -> the standard valuearch decoder, numerically the same model."""
    if getattr(model.config, "pretraining_tp", 1) not in (1, None):
        raise ValueError(f"LlamaConfig.pretraining_tp={model.config.pretraining_tp} is not supported: expected 1")
    config = ValueArchConfig(**carried_fields(model.config, ValueArchConfig))
    return copy_weights(ValueArchForCausalLM(config), model)


def valuearch_to_llama(model: ValueArchForCausalLM) -> LlamaForCausalLM:
    """The standard valuearch decoder -> Llama. Refuses a model that uses any non-Llama option."""
    standard = ValueArchConfig(**carried_fields(model.config, LlamaConfig))
    differing = sorted(name for name in VALUEARCH_OPTION_FIELDS if getattr(model.config, name) != getattr(standard, name))
    if differing or model.config.model_type != "valuearch":
        raise ValueError(
            f"only a standard 'valuearch' model converts to Llama; this {model.config.model_type!r} model sets "
            f"{differing} away from the Llama defaults"
        )
    return copy_weights(LlamaForCausalLM(LlamaConfig(**carried_fields(model.config, LlamaConfig))), model)


def to_valuearch(model: ValueArchForCausalLM) -> ValueArchForCausalLM:
    """The standard valuearch decoder as it is (`convert` has already turned a Llama source into one)."""
    return model


def _converter(reference: str) -> Callable[[PreTrainedModel], PreTrainedModel]:
    """The function a preset's `converter` ("module:function") names."""
    module, function = reference.split(":")
    return getattr(importlib.import_module(module), function)


# target name -> converter from a Llama or valuearch-family model: "llama" plus every preset's declared converter.
CONVERTERS: dict[str, Callable[[PreTrainedModel], PreTrainedModel]] = {
    "llama": valuearch_to_llama,
    **{model_type: _converter(preset.converter) for model_type, preset in PRESETS.items()},
}


def convert(model: PreTrainedModel, target: str) -> PreTrainedModel:
    """Convert an in-memory Llama or valuearch-family model to architecture `target`."""
    if target not in CONVERTERS:
        raise ValueError(f"unknown conversion target {target!r}: allowed targets are {sorted(CONVERTERS)}")
    if isinstance(model, LlamaForCausalLM):
        if target == "llama":
            return model
        model = llama_to_valuearch(model)
    return CONVERTERS[target](model)


def load_for_conversion(path: str | Path) -> PreTrainedModel:
    """Load a Llama or valuearch-family checkpoint directory in its stored dtype."""
    model_type = AutoConfig.from_pretrained(path, trust_remote_code=False).model_type
    if model_type == "llama":
        return LlamaForCausalLM.from_pretrained(path, dtype="auto").eval()
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type][2].from_pretrained(path, dtype="auto").eval()
    raise ValueError(f"cannot convert a {model_type!r} checkpoint: expected 'llama' or one of {sorted(MODEL_TYPES)}")


def convert_checkpoint(source: str | Path, destination: str | Path, target: str) -> PreTrainedModel:
    """Convert the checkpoint directory `source` to `target` and save it (weights, config, code, tokenizer)."""
    model = convert(load_for_conversion(source), target)
    destination = Path(destination)
    model.save_pretrained(destination)
    for name in TOKENIZER_FILES:
        if (Path(source) / name).exists():
            shutil.copy2(Path(source) / name, destination / name)
    return model
