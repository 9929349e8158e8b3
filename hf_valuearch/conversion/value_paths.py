"""Conversions into the value-path architectures (not shipped inside checkpoints).

    to_resformer(model)  -> ResFormerForCausalLM, identical logits: learnable alpha = 1 (on V), beta = 0 (on V1)
    to_satformer(model)  -> SatFormerForCausalLM, identical logits: W_alpha = 0, so every gate ReLU(h W_alpha) = 0
    to_bov(model)        -> BovForCausalLM with the aligned tables E_V[t] = W_V RMSNorm(e[t]) of each target layer;
                            from an x0 W_V-substitutive model (same layers) the logits are identical.

`model` is a transformers `LlamaForCausalLM` or a `ValueArchForCausalLM` with the standard value path (or, for
`to_bov`, an x0-substitutive one). The backbone (sizes, norms, mixers, depth routing) is copied field by field.

`to_satformer`: with W_alpha = 0 every gate logit is exactly 0; the gate's ReLU passes gradient at 0 (see
`GatedV1Values.forward`), so training opens the gates from there. `gate_init_std > 0` uses SATFormer's own
random init N(0, 0.02) instead, at the price of logits that no longer equal the source's at step 0.
"""

from __future__ import annotations

import torch

from ..configuration_valuearch import BovConfig, ResFormerConfig, SatFormerConfig, ValueArchConfig
from ..modeling_valuearch import BovForCausalLM, ResFormerForCausalLM, SatFormerForCausalLM
from ..value_paths import align_value_tables, projects_values
from .common import carried_fields, copy_weights

VALUE_PATH_FIELDS = ("value_source", "value_mix", "value_coefficients", "value_coefficient_init", "value_layers")
def _valuearch_config(config) -> ValueArchConfig:
    """The source config as a ValueArchConfig (a LlamaConfig maps field by field; the defaults are Llama's)."""
    if isinstance(config, ValueArchConfig):
        return config
    return ValueArchConfig(**carried_fields(config, ValueArchConfig))


def _backbone(config: ValueArchConfig) -> dict:
    """Every field of `config` except the value path: what a conversion keeps."""
    return carried_fields(config, ValueArchConfig, exclude=VALUE_PATH_FIELDS)


def _convert(model, target_class, target_config, dropped=()):
    """A `target_class` model with every weight of `model` but `dropped`; only value-path parameters are new."""
    return copy_weights(target_class(target_config), model, new_parameters=(".value_path.",), dropped=dropped)


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
    return _convert(model, ResFormerForCausalLM, target_config)


def to_satformer(model, gate_init_std: float = 0.0) -> SatFormerForCausalLM:
    """SATFormer on every layer >= 1 with W_alpha ~ N(0, gate_init_std); 0 (default) keeps the logits identical."""
    config = _standard_source(model, "satformer")
    target = _convert(model, SatFormerForCausalLM, SatFormerConfig(**_backbone(config)))
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
    target_config = BovConfig(**_backbone(config), **value_path)
    # table layers hold no W_V: the source's W_V there only aligns the tables
    value_projections = {i: layer.self_attn.v_proj for i, layer in enumerate(model.model.layers)
                         if not projects_values(target_config, i)}
    dropped = tuple(f"model.layers.{i}.self_attn.v_proj.{name}" for i in value_projections for name in ("weight", "bias"))
    target = _convert(model, BovForCausalLM, target_config, dropped=dropped)
    align_value_tables(target.model, value_projections)
    return target


__all__ = ["to_resformer", "to_satformer", "to_bov"]
