"""hf_valuearch: value-path and depth/sequence-memory transformer variants for Hugging Face Transformers.

Importing the package registers every model type with AutoConfig / AutoModel / AutoModelForCausalLM
and marks the classes for remote code, so `save_pretrained` writes the modeling files and an
`auto_map` next to the weights.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_valuearch import (
    AttnResConfig,
    BovConfig,
    KvmConfig,
    RdAttnResConfig,
    ResFormerConfig,
    SatFormerConfig,
    ValueArchConfig,
)
from .modeling_valuearch import (
    AttnResForCausalLM,
    AttnResModel,
    BovForCausalLM,
    BovModel,
    KvmForCausalLM,
    KvmModel,
    RdAttnResForCausalLM,
    RdAttnResModel,
    ResFormerForCausalLM,
    ResFormerModel,
    SatFormerForCausalLM,
    SatFormerModel,
    ValueArchForCausalLM,
    ValueArchModel,
    ValueArchPreTrainedModel,
)
from .value_paths import force_v1_gates, place_value_tables

# model_type -> (config class, base model class, causal-LM class); one entry per named architecture.
MODEL_TYPES = {
    ValueArchConfig.model_type: (ValueArchConfig, ValueArchModel, ValueArchForCausalLM),
    # value paths (value_paths.py)
    BovConfig.model_type: (BovConfig, BovModel, BovForCausalLM),
    ResFormerConfig.model_type: (ResFormerConfig, ResFormerModel, ResFormerForCausalLM),
    SatFormerConfig.model_type: (SatFormerConfig, SatFormerModel, SatFormerForCausalLM),
    # depth routing (depth_routing.py)
    AttnResConfig.model_type: (AttnResConfig, AttnResModel, AttnResForCausalLM),
    RdAttnResConfig.model_type: (RdAttnResConfig, RdAttnResModel, RdAttnResForCausalLM),
    # sequence mixers (kvm.py)
    KvmConfig.model_type: (KvmConfig, KvmModel, KvmForCausalLM),
}

for _config_class, _model_class, _lm_class in MODEL_TYPES.values():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    AutoModel.register(_config_class, _model_class, exist_ok=True)
    AutoModelForCausalLM.register(_config_class, _lm_class, exist_ok=True)
    _config_class.register_for_auto_class()
    _model_class.register_for_auto_class("AutoModel")
    _lm_class.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "MODEL_TYPES", "ValueArchConfig", "ValueArchModel", "ValueArchForCausalLM", "ValueArchPreTrainedModel",
    "BovConfig", "BovModel", "BovForCausalLM", "ResFormerConfig", "ResFormerModel", "ResFormerForCausalLM",
    "SatFormerConfig", "SatFormerModel", "SatFormerForCausalLM", "force_v1_gates", "place_value_tables",
    "AttnResConfig", "AttnResModel", "AttnResForCausalLM", "RdAttnResConfig", "RdAttnResModel", "RdAttnResForCausalLM",
    "KvmConfig", "KvmModel", "KvmForCausalLM",
]
