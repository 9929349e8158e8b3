"""Conversion of a Llama / valuearch causal LM into a KVM model (not shipped inside checkpoints)."""

from __future__ import annotations

import logging

import torch

from ..configuration_valuearch import KvmConfig
from ..modeling_valuearch import KvmForCausalLM
from .common import carried_fields, copy_weights

logger = logging.getLogger(__name__)

BEYOND_WINDOW_WARNING = (
    "llama_to_kvm: the KVM model equals its source only while the whole context fits in the KVM window "
    "(kvm_window_chunks * kvm_chunk_size = {window} tokens). Beyond the window it reads older tokens through the "
    "compressed state, which the source was never trained for: the model differs from its source there and "
    "needs continued training."
)


def llama_to_kvm(model, **kvm_fields) -> KvmForCausalLM:
    """Every attention layer of `model` (LlamaForCausalLM or ValueArchForCausalLM) becomes a KVM layer.

    Keeps the source's weights, rotary embedding (its rotary fraction, by default the whole head) and q/k
    normalisation; state keys are therefore kept unzeroed (`kvm_zero_state_rope=False`). The new parameters
    start neutral: merge gate weights 0 (g = 1), head temperatures 1, state LayerNorm the identity affine.
    With a window that covers the input (`kvm_window_chunks * kvm_chunk_size >= length`) the logits equal the
    source's; beyond the window the model differs from its source and needs continued training (a warning
    says so). `kvm_fields` override any `kvm_*` field (chunk size, schedule, ...).
    """
    source = model.config
    fields = carried_fields(source, KvmConfig, exclude=("mixer_types", "sliding_window"))
    rope_parameters = dict(source.rope_parameters)
    rope_parameters.setdefault("partial_rotary_factor", getattr(source, "partial_rotary_factor", None) or 1.0)
    fields.update(
        rope_parameters=rope_parameters,
        qk_norm=getattr(source, "qk_norm", "none"),
        mixer_types=["kvm"] * source.num_hidden_layers,
        kvm_zero_state_rope=False,
        **kvm_fields,
    )
    config = KvmConfig(**fields)
    converted = copy_weights(KvmForCausalLM(config), model, new_parameters=("sequence_mixer.",))
    with torch.no_grad():
        for layer in converted.model.layers:
            mixer = layer.self_attn.sequence_mixer
            if mixer.merge_gate_proj is not None:
                mixer.merge_gate_proj.weight.zero_()
            if mixer.state_temperature is not None:
                mixer.state_temperature.fill_(1.0)
                mixer.window_temperature.fill_(1.0)
            mixer.state_key_norm.reset_parameters()
    logger.warning(BEYOND_WINDOW_WARNING.format(window=config.kvm_window_chunks * config.kvm_chunk_size))
    return converted
