"""Checkpoint conversion between transformers' Llama and the hf_valuearch architectures.

`convert(model, target)` returns a new model of architecture `target`. A Llama source is first
converted to the standard `valuearch` decoder (same parameter names, config renamed field by field:
identical logits); each architecture's converter then starts from a standard `valuearch` model.
The targets are "llama" and every preset, whose declaration (`presets.py`) names its converter and says when
the conversion is exact by construction (`Conversion.exact`); `logit_difference` measures it on a fixed probe
batch.

`FORMATS` reads checkpoints written by the papers' own code (one module per format, `*_checkpoints.py`);
`convert_paper_checkpoint(format, directory)` returns the equivalent hf_valuearch model, or raises ValueError
naming the feature it cannot represent. `scripts/convert.py` is the command-line front end of both.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from .. import MODEL_TYPES, PRESETS
from ..cards import write_model_card
from ..configuration_valuearch import ValueArchConfig
from ..modeling_valuearch import ValueArchForCausalLM
from .common import carried_fields, copy_weights
from .fla_checkpoints import load_fla_attnres
from .kvm_paper_checkpoints import load_kvm_paper
from .nanochat_checkpoints import load_nanochat
from .satformer_checkpoints import load_satformer

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


class Conversion(NamedTuple):
    """A conversion target: its converter, whether it is exact by construction for a given source config,
    and what makes the logits differ (or, when exact, the condition under which they are equal)."""

    convert: Callable[[PreTrainedModel], PreTrainedModel]
    exact: Callable[[object], bool]
    note: str


def to_valuearch(model: ValueArchForCausalLM) -> ValueArchForCausalLM:
    """The standard valuearch decoder as it is (`convert` has already turned a Llama source into one)."""
    return model


def _from_declaration(target) -> Conversion:
    """A preset's `ConversionTarget` with its converter ("module:function") resolved."""
    module, function = target.converter.split(":")
    return Conversion(getattr(importlib.import_module(module), function), target.exact, target.note)


# target name -> conversion from a Llama or valuearch-family model: "llama" plus every preset's declared one.
CONVERTERS: dict[str, Conversion] = {
    "llama": Conversion(valuearch_to_llama, lambda source: True, "the same parameters under a renamed config"),
    **{model_type: _from_declaration(preset.conversion) for model_type, preset in PRESETS.items()},
}


def convert(model: PreTrainedModel, target: str) -> PreTrainedModel:
    """Convert an in-memory Llama or valuearch-family model to architecture `target`."""
    if target not in CONVERTERS:
        raise ValueError(f"unknown conversion target {target!r}: allowed targets are {sorted(CONVERTERS)}")
    if isinstance(model, LlamaForCausalLM):
        if target == "llama":
            return model
        model = llama_to_valuearch(model)
    return CONVERTERS[target].convert(model)


PROBE_SHAPE = (2, 32)  # (batch, length) of the probe batch every conversion is measured on


def probe_batch(vocab_size: int) -> torch.Tensor:
    """The fixed probe batch: PROBE_SHAPE token ids in [0, vocab_size) from a generator seeded with 0."""
    return torch.randint(0, vocab_size, PROBE_SHAPE, generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def logit_difference(source: PreTrainedModel, converted: PreTrainedModel) -> float:
    """max |logits(converted) - logits(source)| on `probe_batch`, each model in its own dtype."""
    ids = probe_batch(min(source.config.vocab_size, converted.config.vocab_size))
    source_logits = source(ids.to(source.device)).logits.float()
    converted_logits = converted(ids.to(converted.device)).logits.float().to(source_logits.device)
    return (converted_logits - source_logits).abs().max().item()


def conversion_report(source: PreTrainedModel, converted: PreTrainedModel, target: str) -> str:
    """Two lines: the measured logit difference on the probe batch, and whether the conversion is exact by
    construction (with the reason)."""
    conversion = CONVERTERS[target]
    exact = "yes" if conversion.exact(source.config) else "no"
    return (f"max |logit difference| against the source on the probe batch ({PROBE_SHAPE[0]} x {PROBE_SHAPE[1]} "
            f"tokens, seed 0): {logit_difference(source, converted):.3g}\n"
            f"exact by construction: {exact} ({conversion.note})")


class PaperFormat(NamedTuple):
    """Checkpoints written by a paper's code: a reader of such a directory, the code's repository, and why the
    conversion is exact by construction."""

    load: Callable[[Path], PreTrainedModel]
    code: str
    note: str


# --from FORMAT of scripts/convert.py: one reader module per format
FORMATS: dict[str, PaperFormat] = {
    "satformer": PaperFormat(load_satformer, "SkyeGunasekaran/SATFormer",
                             "every weight maps to one of model type satformer; V' = V + ReLU(h W_alpha) V1 is its "
                             "relu_gate value path"),
    "fla-attnres": PaperFormat(load_fla_attnres, "fla-org/flash-linear-attention (model type 'transformer')",
                               "every weight maps to one of model type attnres; same block schedule and depth read"),
    "nanochat": PaperFormat(load_nanochat, "karpathy/nanochat (BoV: RiddleHe/nanochat research/bank_of_values)",
                            "every weight maps to one of ours on nanochat's backbone fields (c_q / c_k head halves "
                            "swapped for the rotary direction); long windows are full attention, equal up to "
                            "sequence_len + 1 tokens"),
    "kvm-paper": PaperFormat(load_kvm_paper, "recursal/KVM-paper (RWKV7BackboneForCausalLM, token_mixer 'kvm')",
                             "every weight maps to one of model type kvm on the paper's backbone fields (LayerNorm, "
                             "token shift, sigmoid_lerp value residual, sublayer_scale; q/k rows permuted for the "
                             "rotary layout, bf16 rotary tables and state readout as the paper's); float32 rounding can still flip a hard merge where two slots "
                             "nearly tie, or the bf16 rounding of a readout value near a rounding boundary"),
}


def convert_paper_checkpoint(format_name: str, directory: str | Path) -> PreTrainedModel:
    """Read `directory`, written by the code of paper format `format_name`, as an hf_valuearch model."""
    if format_name not in FORMATS:
        raise ValueError(f"unknown checkpoint format {format_name!r}: allowed formats are {sorted(FORMATS)}")
    if not Path(directory).is_dir():
        raise ValueError(f"{str(directory)!r} is not a directory: expected a {format_name} checkpoint directory")
    return FORMATS[format_name].load(Path(directory))


def reference_logit_difference(model: PreTrainedModel, reference_file: str | Path) -> float:
    """max |logits(model) - reference| for a safetensors file holding `input_ids` and the `logits` the source
    model (run by its own code) produced for them."""
    reference = load_file(reference_file)
    if not {"input_ids", "logits"} <= reference.keys():
        raise ValueError(f"{str(reference_file)!r} must hold tensors 'input_ids' and 'logits'; it holds {sorted(reference)}")
    with torch.no_grad():
        logits = model(reference["input_ids"].to(model.device)).logits.float().cpu()
    if logits.shape != reference["logits"].shape:
        raise ValueError(f"{str(reference_file)!r}: logits of shape {tuple(reference['logits'].shape)}, the converted "
                         f"model gives {tuple(logits.shape)}")
    return (logits - reference["logits"].float()).abs().max().item()


def load_for_conversion(path: str | Path) -> PreTrainedModel:
    """Load a Llama or valuearch-family checkpoint directory in its stored dtype.

    Raises ValueError (one line) when `path` is not such a checkpoint: not a directory, no config.json, an
    unknown model type, or weights that do not load.
    """
    path = Path(path)
    expected = "a checkpoint directory written by save_pretrained (LlamaForCausalLM or an hf_valuearch model)"
    if not path.is_dir():
        raise ValueError(f"{str(path)!r} is not a directory: expected {expected}")
    if not (path / "config.json").is_file():
        raise ValueError(f"{str(path)!r} has no config.json: expected {expected}")
    try:
        model_type = AutoConfig.from_pretrained(path, trust_remote_code=False).model_type
    except (OSError, ValueError) as error:
        raise ValueError(f"{str(path)!r}: config.json does not load ({_first_line(error)})") from error
    if model_type == "llama":
        model_class = LlamaForCausalLM
    elif model_type in MODEL_TYPES:
        model_class = MODEL_TYPES[model_type][2]
    else:
        raise ValueError(f"cannot convert a {model_type!r} checkpoint: expected 'llama' or one of {sorted(MODEL_TYPES)}")
    try:
        return model_class.from_pretrained(path, dtype="auto").eval()
    except OSError as error:  # no or unreadable weight files
        raise ValueError(f"{str(path)!r}: the weights do not load ({_first_line(error)})") from error


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def save_converted(model: PreTrainedModel, destination: str | Path, tokenizer_source: str | Path) -> None:
    """Save a converted model (weights, config, remote code) with the tokenizer files found in `tokenizer_source`
    (the source checkpoint) and, for hf_valuearch targets, a model card naming the source as its base model."""
    destination = Path(destination)
    model.save_pretrained(destination)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_source) / name).exists():
            shutil.copy2(Path(tokenizer_source) / name, destination / name)
    if model.config.model_type in MODEL_TYPES:
        write_model_card(destination, record={"base_model": str(tokenizer_source),
                                              "converted_to": model.config.model_type})


def convert_checkpoint(source: str | Path, destination: str | Path, target: str) -> PreTrainedModel:
    """Convert the checkpoint directory `source` to `target` and save it (weights, config, code, tokenizer)."""
    model = convert(load_for_conversion(source), target)
    save_converted(model, destination, source)
    return model
