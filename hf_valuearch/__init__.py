"""hf_valuearch: value-path and depth/sequence-memory transformer variants for Hugging Face Transformers.

Importing the package registers every model type with AutoConfig / AutoModel / AutoModelForCausalLM
and marks the classes for remote code, so `save_pretrained` writes the modeling files and an
`auto_map` next to the weights. The model types and their classes come from the declarations in
`presets.py` (one `Preset` per named architecture).
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_valuearch import CONFIG_CLASSES, ValueArchConfig
from .modeling_valuearch import MODEL_CLASSES, ValueArchForCausalLM, ValueArchModel, ValueArchPreTrainedModel
from .presets import PRESETS, Paper, Preset
from .value_paths import force_v1_gates, place_value_tables

# model_type -> (config class, base model class, causal-LM class); one entry per preset in presets.py.
MODEL_TYPES = {model_type: (CONFIG_CLASSES[model_type], *MODEL_CLASSES[model_type]) for model_type in PRESETS}

for _config_class, _model_class, _lm_class in MODEL_TYPES.values():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    AutoModel.register(_config_class, _model_class, exist_ok=True)
    AutoModelForCausalLM.register(_config_class, _lm_class, exist_ok=True)
    _config_class.register_for_auto_class()
    _model_class.register_for_auto_class("AutoModel")
    _lm_class.register_for_auto_class("AutoModelForCausalLM")

# every preset's classes as package attributes: hf_valuearch.BovConfig, hf_valuearch.BovForCausalLM, ...
globals().update({cls.__name__: cls for classes in MODEL_TYPES.values() for cls in classes})

__all__ = [
    "MODEL_TYPES", "PRESETS", "Paper", "Preset", "ValueArchPreTrainedModel", "force_v1_gates", "place_value_tables",
    *(cls.__name__ for classes in MODEL_TYPES.values() for cls in classes),
]
