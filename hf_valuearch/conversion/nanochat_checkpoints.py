"""Checkpoints of nanochat (karpathy/nanochat's checkpoint_manager format: `model_<step>.pt` holding the state
dict, `meta_<step>.json` holding `model_type` and `model_config`) -> `valuearch` or a value-path architecture
(`bov` for BoV). Format "nanochat" of `scripts/convert.py --from`.

Representable: the `gpt_base` family of BoV's fork (RiddleHe/nanochat, branch `research/bank_of_values`,
`nanochat/model/gpt_base.py`), i.e. nanochat's backbone (embedding norm, smear gate, weightless RMSNorm, q/k norm
scaled by 1.2, ReLU² MLP, softcap 15, RoPE base 100000, window pattern) with one of BoV's value paths:

    v_from_value_emb -> table substitute (BoV)     add_init_value_emb -> table add
    v_from_x0        -> x0 substitute              add_init_res_v     -> x0 add
    v_from_v1        -> v1 substitute              add_init_v         -> v1 add
    v_scale_learn    -> learnable gamma on V

fixed (0.5 / 0.5, gamma 1) or learnable (`learn_init_coeffs`), on the last third (default), every other layer,
every layer, the second half or the last two thirds. Each weight maps to one of ours, so the conversion is exact
by construction (up to nanochat's long windows of sequence_len + 1 keys, which are full attention here: equal up
to that length). Conventions (configs/value_paths/README.md): nanochat rotates each pair (x_i, x_{i+D/2}) by -θ,
we by +θ, so every head's two halves of c_q and c_k rows swap; padded vocabulary rows are dropped; a window
(w, 0) is `sliding_window = w + 1`. Everything else (karpathy/nanochat's `gpt` model with per-layer lambdas,
backout and gated value embeddings; BoV's other flags) is refused by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .. import MODEL_TYPES
from ..configuration_valuearch import ValueArchConfig
from .common import NANOGPT_NAMES, load_renamed

FLOAT32_EPS = torch.finfo(torch.float32).eps  # F.rms_norm(x, (d,)) without eps, on float32 activations

# gpt_base flags with no equivalent here -> what they do
UNSUPPORTED_FLAGS = {
    "add_init_res": "x = alpha x + beta x0 before each target block",
    "add_init_pre_norm_attn_only": "x0 mixed into the attention pre-norm input",
    "add_init_pre_norm_mlp_only": "x0 mixed into the MLP pre-norm input",
    "add_init_qkv": "q, k, v blended with projections of x0",
    "add_init_qkv_shared": "q, k, v blended with projections of x0",
    "v_exclude_self": "exclusive self-attention (the output's component along v removed)",
    "add_init_proj": "c_proj(norm(x0)) added to the attention output",
    "add_init_value_emb_nanogpt": "gated value embeddings v + 3 sigmoid(W x[:12]) VE[idx]",
    "value_emb_shared": "one value table shared by all target layers",
    "learn_init_scaling_vec": "a per-head scale on V1",
}
# gpt_base value-path flag -> (value_source, value_mix)
VALUE_PATH_FLAGS = {
    "v_from_value_emb": ("table", "substitute"), "v_from_x0": ("x0", "substitute"),
    "v_from_v1": ("v1", "substitute"), "v_scale_learn": ("residual", "substitute"),
    "add_init_value_emb": ("table", "add"), "add_init_res_v": ("x0", "add"), "add_init_v": ("v1", "add"),
}
# nanochat names -> ours (per layer i); c_q / c_k rows are also half-swapped, see `_swap_halves`
NANOCHAT_NAMES = [
    *NANOGPT_NAMES,
    (r"^smear_gate\.weight$", "model.smear.gate_proj.weight"),
    (r"^smear_lambda$", "model.smear.scale"),
    (r"^value_embeds\.(\d+)\.weight$", r"model.layers.\1.self_attn.value_path.value_table.weight"),
    (r"^transformer\.h\.(\d+)\.attn\.gamma_v$", r"model.layers.\1.self_attn.value_path.value_scale"),
    (r"^transformer\.h\.(\d+)\.attn\.alpha_v$", r"model.layers.\1.self_attn.value_path.residual_scale"),
    (r"^transformer\.h\.(\d+)\.attn\.beta_v$", r"model.layers.\1.self_attn.value_path.source_scale"),
]


def read_nanochat_checkpoint(directory: Path, source: str) -> tuple[dict, dict]:
    """(meta, state dict in float32 without torch.compile's `_orig_mod.` prefix) of the latest step in `directory`."""
    steps = sorted(int(m.group(1)) for path in directory.glob("model_*.pt")
                   if (m := re.fullmatch(r"model_(\d+)\.pt", path.name)))
    if not steps:
        raise ValueError(f"{source} has no model_<step>.pt: expected a nanochat checkpoint directory "
                         "(model_<step>.pt and meta_<step>.json, as nanochat's checkpoint_manager writes)")
    step = steps[-1]
    meta_path = directory / f"meta_{step:06d}.json"
    if not meta_path.is_file():
        raise ValueError(f"{source} has model_{step:06d}.pt but no {meta_path.name}")
    meta = json.loads(meta_path.read_text())
    state_dict = torch.load(directory / f"model_{step:06d}.pt", map_location="cpu", weights_only=True)
    return meta, {name.removeprefix("_orig_mod."): tensor.float() for name, tensor in state_dict.items()}


def _layer_set(model_config: dict, layers: int):
    """BoV's target layers (`_is_target_layer` precedence) as a `value_layers` value."""
    if model_config.get("on_every_layer"):
        return "all"
    if model_config.get("on_every_two_layers"):
        return "every_other"
    if model_config.get("on_second_half_layers"):
        return list(range(layers // 2, layers))
    if model_config.get("on_last_two_thirds_layers"):
        return list(range(layers // 3, layers))
    return "last_third"


def _windows(model_config: dict) -> dict:
    """nanochat's window pattern (tiled, last layer long): S = (short, 0), short = ceil(T / 4 / 128) * 128 keys
    back plus the current one; L = (T, 0), full attention here (equal up to T + 1 tokens)."""
    pattern, layers, length = model_config.get("window_pattern", "L").upper(), model_config["n_layer"], model_config["sequence_len"]
    mixers = ["sliding_attention" if pattern[i % len(pattern)] == "S" else "full_attention" for i in range(layers)]
    mixers[-1] = "full_attention"
    short = -(-length // 4 // 128) * 128
    return {"mixer_types": mixers, "sliding_window": short + 1 if "sliding_attention" in mixers else None}


def nanochat_config(meta: dict, source: str) -> ValueArchConfig:
    """The hf_valuearch config of a nanochat checkpoint's meta; ValueError naming any unsupported feature."""
    model_type, model_config = meta.get("model_type", "gpt"), meta.get("model_config")
    if model_config is None:
        raise ValueError(f"{source}: meta has no model_config")
    if not model_type.startswith("gpt_base"):
        raise ValueError(
            f"{source}: model_type {model_type!r} (nanochat's gpt.py) is not supported: its per-layer resid_lambdas "
            "and x0_lambdas, backout_lambda and gated value embeddings (ve_gate) have no equivalent here; supported "
            "are the gpt_base models of BoV's nanochat (RiddleHe/nanochat, branch research/bank_of_values)")
    unsupported = [f"{flag} ({meaning})" for flag, meaning in UNSUPPORTED_FLAGS.items() if model_config.get(flag)]
    if unsupported:
        raise ValueError(f"{source}: {', '.join(unsupported)} not supported")
    hidden, heads = model_config["n_embd"], model_config["n_head"]
    fields = dict(
        vocab_size=model_config["vocab_size"], hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=model_config["n_layer"], num_attention_heads=heads,
        num_key_value_heads=model_config["n_kv_head"], head_dim=hidden // heads,
        max_position_embeddings=model_config["sequence_len"], mlp_activation="relu2", qk_norm="rmsnorm",
        qk_norm_eps=FLOAT32_EPS, qk_scale=1.2, norm_weights=False, embedding_norm=True, smear_gate=True,
        initialization="nanochat", rms_norm_eps=FLOAT32_EPS, final_logit_softcapping=15.0,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **_windows(model_config),
    )
    flags = [flag for flag in VALUE_PATH_FLAGS if model_config.get(flag)]
    if not flags:
        return ValueArchConfig(**fields)
    value_source, value_mix = VALUE_PATH_FLAGS[flags[0]]
    layers = _layer_set(model_config, fields["num_hidden_layers"])
    if value_source == "v1" and isinstance(layers, list):
        layers = [i for i in layers if i != 0]  # BoV: layer 0 makes V1
    learnable = bool(model_config.get("learn_init_coeffs")) or flags[0] == "v_scale_learn"
    model_type = "bov" if (value_source, value_mix, learnable) == ("table", "substitute", True) else "valuearch"
    return MODEL_TYPES[model_type][0](**fields, value_source=value_source, value_mix=value_mix, value_layers=layers,
                                      value_coefficients="learnable" if learnable else "fixed")


def _swap_halves(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of c_q / c_k [heads * D, hidden] with each head's two halves swapped: nanochat's -θ rotation of the
    pair (x_i, x_{i+D/2}) is our +θ rotation of (x_{i+D/2}, x_i)."""
    rows = weight.view(-1, 2, head_dim // 2, weight.shape[-1])  # [heads, half, D/2, hidden]
    return rows.flip(1).reshape(weight.shape)


def nanochat_weights(state_dict: dict, model) -> tuple[dict, list[str]]:
    """nanochat's weights under `model`'s names ([renamed state dict], [names without a place]): c_q / c_k head
    halves swapped, padded vocabulary rows dropped, BoV's dead c_v skipped where `model` has no v_proj."""
    config, own_names = model.config, set(model.state_dict())
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in NANOCHAT_NAMES]
    renamed, unplaced = {}, []
    for name, tensor in state_dict.items():
        target = next((pattern.sub(replacement, name) for pattern, replacement in compiled if pattern.search(name)), None)
        if target is None:
            unplaced.append(name)
            continue
        if target.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = _swap_halves(tensor, config.head_dim)
        if target in ("model.embed_tokens.weight", "lm_head.weight") or target.endswith("value_table.weight"):
            tensor = tensor[: config.vocab_size]  # nanochat pads the vocabulary to a multiple of 64
        if target.endswith(("value_scale", "residual_scale", "source_scale")):
            tensor = tensor.reshape(())
        if target.endswith("v_proj.weight") and target not in own_names:
            continue  # BoV's dead c_v at table / V1-substituted layers: no gradient, not used, not kept here
        renamed[target] = tensor
    return renamed, unplaced


def load_nanochat(directory):
    """A nanochat checkpoint directory -> BovForCausalLM (BoV) or ValueArchForCausalLM (the other gpt_base models)."""
    directory = Path(directory)
    source = f"nanochat checkpoint {str(directory)!r}"
    meta, state_dict = read_nanochat_checkpoint(directory, source)
    config = nanochat_config(meta, source)
    model = MODEL_TYPES[config.model_type][2](config)
    renamed, unplaced = nanochat_weights(state_dict, model)
    if unplaced:
        raise ValueError(f"{source}: weights {sorted(unplaced)} belong to features hf_valuearch cannot represent")
    return load_renamed(model, renamed, lambda name: name, source)
