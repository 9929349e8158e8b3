"""Checkpoints of fla-org/flash-linear-attention's `transformer` model (`TransformerForCausalLM`), including its
Block Attention Residuals (`attnres_block_size`), -> `attnres` (or the standard `valuearch` decoder without
AttnRes). Format "fla-attnres" of `scripts/convert.py --from`.

fla's transformer is this package's backbone under other names: pre-norm RMSNorm, RoPE with rotate_half and
θ^(-2i/d), SwiGLU, GQA (query head h reads KV head h // groups), optional per-head q/k RMSNorm (fla's `RMSNorm`
default ε = 1e-5), a sliding window of `window_size` keys including the query's own. Its AttnRes has the same
block schedule (sublayer 2l is layer l's attention, 2l + 1 its MLP; a block starts every `attnres_block_size`
sublayers), the same read (softmax over w · RMSNorm(v_j), learnable key-norm weight, then the sublayer's
pre-norm) and a final read before the final norm. Each weight therefore maps to one of ours and the conversion
is exact by construction. SATFormer checkpoints are fla-style too (conversion/satformer_checkpoints.py).
"""

from __future__ import annotations

import re

from ..configuration_valuearch import AttnResConfig, ValueArchConfig
from ..modeling_valuearch import AttnResForCausalLM, ValueArchForCausalLM
from .common import load_renamed, read_hf_checkpoint

FLA_QK_NORM_EPS = 1e-5  # fla.modules.RMSNorm's default epsilon, used by fla's Attention for q_norm / k_norm

# fla-style parameter name -> ours (regex substitutions, tried in order; the first that matches wins)
FLA_NAMES = [
    (r"^model\.embeddings\.", "model.embed_tokens."),
    (r"^model\.layers\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^model\.layers\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^model\.layers\.(\d+)\.attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.", r"model.layers.\1.self_attn.\2."),
    (r"^model\.layers\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.", r"model.layers.\1.mlp.\2."),
    (r"^model\.norm\.", "model.norm."),
    (r"^lm_head\.", "lm_head."),
]
# fla's AttnRes: pseudo-query projections Linear(D, 1) [1, D] and key norms nn.RMSNorm(D)
ATTNRES_NAMES = [
    (r"^model\.layers\.(\d+)\.(attn|mlp)_res_proj\.weight$", r"model.layers.\1.router.\2_route_query"),
    (r"^model\.layers\.(\d+)\.(attn|mlp)_res_norm\.weight$", r"model.layers.\1.router.\2_route_key_norm.weight"),
    (r"^model\.res_proj\.weight$", "model.readout.final_route_query"),
    (r"^model\.res_norm\.weight$", "model.readout.final_route_key_norm.weight"),
]


def renamer(rules):
    """name -> our name under the first matching rule of `rules` ((pattern, replacement) pairs), or None."""
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in rules]

    def rename(name: str) -> str | None:
        for pattern, replacement in compiled:
            if pattern.search(name):
                return pattern.sub(replacement, name)
        return None

    return rename


def _require(source: str, config: dict, field: str, allowed, meaning: str):
    value = config.get(field)
    if value not in allowed:
        raise ValueError(f"{source}: {field}={value!r} ({meaning}) is not supported: hf_valuearch represents "
                         f"{field} in {list(allowed)}")


def fla_backbone_fields(config: dict, source: str) -> dict:
    """ValueArchConfig fields of an fla-style `TransformerConfig` dict; ValueError naming what has no equivalent."""
    _require(source, config, "qkv_bias", (False, None), "biases on q, k, v but not on the output projection")
    _require(source, config, "hidden_act", ("swish",), "the gated MLP's activation")
    if config.get("rope_theta") is None:
        raise ValueError(f"{source}: rope_theta=None (no rotary embedding) is not supported")
    hidden, heads = config["hidden_size"], config["num_heads"]
    intermediate = config.get("intermediate_size")
    if intermediate is None:  # fla.modules.GatedMLP: 2/3 * hidden * ratio rounded up to a multiple of 256
        intermediate = int(hidden * (config.get("hidden_ratio") or 4) * 2 / 3)
        intermediate = 256 * ((intermediate + 255) // 256)
    window = config.get("window_size")
    fields = dict(
        vocab_size=config["vocab_size"], hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=config["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=config.get("num_kv_heads") or heads, head_dim=hidden // heads, hidden_act="silu",
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        initializer_range=config.get("initializer_range", 0.02), rms_norm_eps=config.get("norm_eps", 1e-6),
        rope_parameters={"rope_type": "default", "rope_theta": float(config["rope_theta"])},
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        bos_token_id=config.get("bos_token_id"), eos_token_id=config.get("eos_token_id"),
        pad_token_id=config.get("pad_token_id"),
        # fla's window (window_size - 1, 0) covers window_size keys including the query's own, as ours does
        mixer_types=["sliding_attention" if window else "full_attention"] * config["num_hidden_layers"],
        sliding_window=window,
    )
    if config.get("qk_norm"):
        fields.update(qk_norm="rmsnorm", qk_norm_eps=FLA_QK_NORM_EPS)
    else:
        fields.update(qk_norm="none")
    return fields


def read_fla_checkpoint(directory, model_type: str, format_name: str, source: str) -> tuple[dict, dict, dict]:
    """(config dict, state dict, our backbone fields) of an fla-style checkpoint whose model_type must be `model_type`."""
    config, state_dict = read_hf_checkpoint(directory)
    if config.get("model_type") != model_type:
        raise ValueError(f"{source} has model_type {config.get('model_type')!r}: format {format_name!r} reads "
                         f"{model_type!r} checkpoints")
    return config, state_dict, fla_backbone_fields(config, source)


def load_fla_attnres(directory) -> ValueArchForCausalLM:
    """An fla `transformer` checkpoint directory -> AttnResForCausalLM (ValueArchForCausalLM without AttnRes)."""
    source = f"fla checkpoint {str(directory)!r}"
    config, state_dict, fields = read_fla_checkpoint(directory, "transformer", "fla-attnres", source)
    if config.get("attnres_block_size") is None:
        return load_renamed(ValueArchForCausalLM(ValueArchConfig(**fields)), state_dict, renamer(FLA_NAMES), source)
    model = AttnResForCausalLM(AttnResConfig(**fields, attnres_block_size=config["attnres_block_size"]))
    rename_attnres = renamer(ATTNRES_NAMES + FLA_NAMES)
    # fla's pseudo-queries are Linear(D, 1) weights [1, D]; ours are vectors [D]
    state_dict = {name: tensor.reshape(-1) if name.endswith("res_proj.weight") else tensor
                  for name, tensor in state_dict.items()}
    return load_renamed(model, state_dict, rename_attnres, source)
