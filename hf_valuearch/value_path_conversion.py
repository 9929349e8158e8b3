"""Conversions into the value-path architectures (not shipped inside checkpoints).

    to_resformer(model)  -> ResFormerForCausalLM, identical logits: learnable alpha = 1 (on V), beta = 0 (on V1)
    to_satformer(model)  -> SatFormerForCausalLM, identical logits: W_alpha = 0, so every gate ReLU(h W_alpha) = 0
    to_bov(model)        -> BovForCausalLM with the aligned tables E_V[t] = W_V RMSNorm(e[t]) of each target layer;
                            from an x0 W_V-substitutive model (same layers) the logits are identical.

`model` is a transformers `LlamaForCausalLM` or a `ValueArchForCausalLM` with the standard value path (or, for
`to_bov`, an x0-substitutive one). The backbone (sizes, norms, mixers, depth routing) is copied field by field.

Caveat for `to_satformer`: with W_alpha = 0 every gate logit is exactly 0, where ReLU's gradient is 0, so plain
gradient training never opens the gates. Pass `gate_init_std > 0` (SATFormer's own init is N(0, 0.02)) to
train them, at the price of logits that no longer equal the source's at step 0.
"""

from __future__ import annotations

import torch

from .configuration_valuearch import BovConfig, ResFormerConfig, SatFormerConfig, ValueArchConfig
from .modeling_valuearch import BovForCausalLM, ResFormerForCausalLM, SatFormerForCausalLM
from .value_paths import align_value_tables

VALUE_PATH_FIELDS = ("value_source", "value_mix", "value_coefficients", "value_coefficient_init", "value_layers")
_NOT_COPIED = {"model_type", "architectures", "auto_map", "transformers_version", "_name_or_path", "dtype"}


def _valuearch_config(config) -> ValueArchConfig:
    """The source config as a ValueArchConfig (a LlamaConfig maps field by field; the defaults are Llama's)."""
    if isinstance(config, ValueArchConfig):
        return config
    known = ValueArchConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=8, num_attention_heads=1).to_dict()
    return ValueArchConfig(**{k: v for k, v in config.to_dict().items() if k in known and k not in _NOT_COPIED})


def _backbone(config: ValueArchConfig) -> dict:
    """Every field of `config` except the value path: what a conversion keeps."""
    return {k: v for k, v in config.to_dict().items() if k not in _NOT_COPIED and k not in VALUE_PATH_FIELDS}


def _convert(model, target_class, target_config):
    """A `target_class` model with every weight of `model`; returns it and the names of its new parameters."""
    target = target_class(target_config).to(dtype=model.dtype, device=model.device).eval()
    result = target.load_state_dict(model.state_dict(), strict=False)
    if result.unexpected_keys:
        raise ValueError(f"conversion to {target_config.model_type}: weights without a place: {result.unexpected_keys}")
    if any(".value_path." not in key for key in result.missing_keys):
        raise ValueError(f"conversion to {target_config.model_type}: backbone weights missing: {result.missing_keys}")
    target.tie_weights()
    return target, result.missing_keys


def _standard_source(model, target: str) -> ValueArchConfig:
    config = _valuearch_config(model.config)
    if config.value_layers is not None:
        raise ValueError(
            f"conversion to {target} needs a model with the standard value path; got value_source="
            f"{config.value_source!r}, value_layers={config.value_layers!r}."
        )
    return config


def to_resformer(model) -> ResFormerForCausalLM:
    """ResFormer on every layer >= 1 with learnable lambdas initialised to the identity: V' = 1 * V + 0 * V1."""
    config = _standard_source(model, "resformer")
    target_config = ResFormerConfig(**_backbone(config), value_coefficients="learnable", value_coefficient_init=[1.0, 0.0])
    return _convert(model, ResFormerForCausalLM, target_config)[0]


def to_satformer(model, gate_init_std: float = 0.0) -> SatFormerForCausalLM:
    """SATFormer on every layer >= 1 with W_alpha ~ N(0, gate_init_std); 0 (default) keeps the logits identical."""
    config = _standard_source(model, "satformer")
    target, _ = _convert(model, SatFormerForCausalLM, SatFormerConfig(**_backbone(config)))
    with torch.no_grad():
        for layer in target.model.layers:
            if hasattr(layer.self_attn.value_path, "v1_gate"):
                layer.self_attn.value_path.v1_gate.weight.normal_(0.0, gate_init_std)
    return target


def to_bov(model) -> BovForCausalLM:
    """BoV with aligned tables. A standard source gets BoV's defaults (last third, gamma = 1); an x0 W_V-substitutive
    source keeps its layers and coefficients, and its gamma weights carry over, so the logits stay identical."""
    config = _valuearch_config(model.config)
    if config.value_layers is None:
        value_path = {}
    elif config.value_source == "x0" and config.value_mix == "substitute":
        value_path = {field: getattr(config, field) for field in ("value_layers", "value_coefficients",
                                                                  "value_coefficient_init")}
    else:
        raise ValueError(
            "conversion to bov needs a standard or an x0 W_V-substitutive model; got value_source="
            f"{config.value_source!r}, value_mix={config.value_mix!r}."
        )
    target, _ = _convert(model, BovForCausalLM, BovConfig(**_backbone(config), **value_path))
    align_value_tables(target.model)
    return target


__all__ = ["to_resformer", "to_satformer", "to_bov"]
