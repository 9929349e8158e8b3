"""hf_valuearch: value-path and depth/sequence-memory transformer variants for Hugging Face Transformers.

Importing the package registers every model type with AutoConfig / AutoModel / AutoModelForCausalLM
and marks the classes for remote code, so `save_pretrained` writes the modeling files and an
`auto_map` next to the weights. The model types and their classes come from the declarations in
`presets.py` (one `Preset` per named architecture).
"""

import importlib.abc
import importlib.util
import sys

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_valuearch import CONFIG_CLASSES, ValueArchConfig
from .modeling_valuearch import MODEL_CLASSES, ValueArchForCausalLM, ValueArchModel, ValueArchPreTrainedModel
from .presets import PRESETS, Paper, Preset
from .value_paths import force_v1_gates, place_value_tables

# model_type -> (config class, base model class, causal-LM class); one entry per preset in presets.py.
MODEL_TYPES = {model_type: (CONFIG_CLASSES[model_type], *MODEL_CLASSES[model_type]) for model_type in PRESETS}
# every preset's classes as package attributes: hf_valuearch.BovConfig, hf_valuearch.BovForCausalLM, ...
globals().update({cls.__name__: cls for classes in MODEL_TYPES.values() for cls in classes})

for _config_class, _model_class, _lm_class in MODEL_TYPES.values():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    AutoModel.register(_config_class, _model_class, exist_ok=True)
    AutoModelForCausalLM.register(_config_class, _lm_class, exist_ok=True)
    _config_class.register_for_auto_class()
    _model_class.register_for_auto_class("AutoModel")
    _lm_class.register_for_auto_class("AutoModelForCausalLM")

# --- PEFT: LoRA's default target modules for every model type, as PEFT has them for Llama ------------------
LORA_TARGET_MODULES = ["q_proj", "v_proj"]  # peft TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["llama"]


def register_lora_defaults(mapping: dict) -> None:
    """Add every model type to PEFT's `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`."""
    for model_type in MODEL_TYPES:
        mapping.setdefault(model_type, list(LORA_TARGET_MODULES))


class RegisterLoraDefaultsOnPeftImport(importlib.abc.MetaPathFinder):
    """Registers the LoRA defaults when peft loads its constants module, so that `import hf_valuearch` never
    imports peft (about 5 s) and `LoraConfig()` without target_modules works whichever is imported first."""

    def find_spec(self, name, path, target=None):
        if name != "peft.utils.constants":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # the regular finders, now that this one is gone
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            register_lora_defaults(module.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)

        spec.loader.exec_module = exec_and_register
        return spec


if "peft.utils.constants" in sys.modules:
    register_lora_defaults(sys.modules["peft.utils.constants"].TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
else:
    sys.meta_path.insert(0, RegisterLoraDefaultsOnPeftImport())

# `model.push_to_hub(repo_id)` uploads this package's model card instead of transformers' blank template.
from .cards.hub import push_model_to_hub  # noqa: E402 (cards read MODEL_TYPES)

ValueArchPreTrainedModel.push_to_hub = push_model_to_hub

__all__ = [
    "MODEL_TYPES", "PRESETS", "Paper", "Preset", "LORA_TARGET_MODULES", "ValueArchPreTrainedModel", "force_v1_gates",
    "place_value_tables", *(cls.__name__ for classes in MODEL_TYPES.values() for cls in classes),
]
