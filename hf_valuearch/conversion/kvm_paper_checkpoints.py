"""Checkpoints of recursal/KVM-paper (`RWKV7BackboneForCausalLM` with `token_mixer: kvm`, written by its trainer's
`save_pretrained`) -> `kvm`. Format "kvm-paper" of `scripts/convert.py --from`.

The paper's backbone (spec_kvm.md A.1) on this package's fields: LayerNorm with bias for the embedding, block and
final norms (`norm_type="layernorm"`, `embedding_norm`, ε 1e-5), token shift on q, k, v and the MLP input
(`token_shift`), the value residual V' = V + σ(b + h W_down W_up) ⊙ (V1 - V) (value path "v1" /
"sigmoid_lerp" on every layer after the first, whose own gate has no effect: there V1 = V), per-head LayerNorm of q
and k (ε 1e-5), ReLU² MLP, the paper's rotary frequencies with bf16 cos/sin tables (`rope_type="linspace"`,
`rope_table_dtype`), its bf16 rounding of the state readout (`kvm_readout_dtype`).

`residual_scale` (h + s f(h), 0.5 in the 350M configs) is `sublayer_scale`. The rotary layout differs: the paper
rotates interleaved pairs by -θ, we rotate (x_i, x_{i+n}) by +θ; every q/k head's rows of W_Q, W_K and its
per-dimension q/k-norm, state-norm and q/k token-shift parameters are permuted by `paper_rotary_permutation`
(scores are unchanged, the rotary half stays first: docs/fidelity.md).

Everything else the reference can configure and this package cannot represent is refused by name.
"""

from __future__ import annotations

import re

import torch

from ..configuration_valuearch import KvmConfig
from ..modeling_valuearch import KvmForCausalLM
from .common import NANOGPT_NAMES, load_renamed, read_hf_checkpoint

PAPER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, every norm of the paper's backbone
UNBOUNDED_CONTEXT = 1024**3  # the paper's default max_position_embeddings: no limit (its RoPE has none)
TRAINING_CONTEXT = 8192  # the paper's training sequence length (spec_kvm.md A.7)
STATE_SCHEDULES = {"fixed": "fixed", "power_law": "power_law", "kvm_saturation": "saturating"}

# the paper's parameter name -> ours (regex substitutions, the first that matches wins)
PAPER_NAMES = [
    *NANOGPT_NAMES,
    (r"^transformer\.ln_emb\.", "model.embedding_norm."),
    (r"^transformer\.ln_head\.", "model.norm."),
    (r"^transformer\.h\.(\d+)\.ln_attn\.", r"model.layers.\1.input_layernorm."),
    (r"^transformer\.h\.(\d+)\.ln_mlp\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^transformer\.h\.(\d+)\.attn\.ln_q\.", r"model.layers.\1.self_attn.q_norm."),
    (r"^transformer\.h\.(\d+)\.attn\.ln_k\.", r"model.layers.\1.self_attn.k_norm."),
    (r"^transformer\.h\.(\d+)\.attn\.x_(q|k|v)$", r"model.layers.\1.self_attn.\2_token_shift.mix"),
    (r"^transformer\.h\.(\d+)\.attn\.v_gate0$", r"model.layers.\1.self_attn.value_path.v1_gate_bias"),
    (r"^transformer\.h\.(\d+)\.attn\.v_gate1\.", r"model.layers.\1.self_attn.value_path.v1_gate_down."),
    (r"^transformer\.h\.(\d+)\.attn\.v_gate2\.", r"model.layers.\1.self_attn.value_path.v1_gate_up."),
    (r"^transformer\.h\.(\d+)\.attn\.ln_s_k\.", r"model.layers.\1.self_attn.sequence_mixer.state_key_norm."),
    (r"^transformer\.h\.(\d+)\.attn\.key_weighting\.", r"model.layers.\1.self_attn.sequence_mixer.merge_gate_proj."),
    (r"^transformer\.h\.(\d+)\.attn\.front_head_temp$", r"model.layers.\1.self_attn.sequence_mixer.window_temperature"),
    (r"^transformer\.h\.(\d+)\.attn\.state_head_temp$", r"model.layers.\1.self_attn.sequence_mixer.state_temperature"),
    (r"^transformer\.h\.(\d+)\.mlp\.x_k$", r"model.layers.\1.mlp.token_shift.mix"),
]
# per-head dimensions in the paper's rotary layout: permuted into ours
ROTARY_LAYOUT = re.compile(r"\.attn\.(c_q\.weight|c_k\.weight|ln_q\.\w+|ln_k\.\w+|ln_s_k\.\w+|x_q|x_k)$")


def paper_rotary_permutation(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Our dimension j of a head is the paper's dimension perm[j]: its odd rotary dims, then its even ones, then the
    unrotated rest. Pairs (x_2i+1, x_2i) turned by -θ are our pairs (x_i, x_{i+n}) turned by +θ."""
    return torch.cat([torch.arange(1, rotary_dim, 2), torch.arange(0, rotary_dim, 2),
                      torch.arange(rotary_dim, head_dim)])


def _refuse(source: str, field: str, value, meaning: str, allowed: str):
    raise ValueError(f"{source}: {field}={value!r} ({meaning}) is not supported: hf_valuearch represents {allowed}")


def kvm_paper_fields(config: dict, source: str) -> dict:
    """KvmConfig fields of the paper's `MixerConfig` dict; ValueError naming any feature without an equivalent."""
    def get(field, default=None):
        return config.get(field, default)

    if get("model_type") != "rwkv7backbone":
        raise ValueError(f"{source} has model_type {get('model_type')!r}: format 'kvm-paper' reads 'rwkv7backbone' "
                         "checkpoints (recursal/KVM-paper's RWKV7BackboneForCausalLM)")
    if get("token_mixer") != "kvm" or get("token_mixer_class_path") is not None:
        _refuse(source, "token_mixer", get("token_mixer_class_path") or get("token_mixer"), "the sequence mixer",
                "token_mixer='kvm' only")
    if (get("alt_layer_every") or -1) > 1:
        _refuse(source, "alt_layer_every", get("alt_layer_every"), f"every n-th layer is a {get('alt_token_mixer')!r} "
                "layer with its own rotary embedding", "one rotary embedding for all layers: alt_layer_every <= 1")
    for field, meaning in (("use_skip_connections", "U-Net skip connections between layers"),
                           ("use_block_lambdas", "x = λ0 x + λ1 x0 before each block"),
                           ("kvm_apply_merge_gate_to_initial_state", "the merge gate scales the first chunk's slots")):
        if get(field):
            _refuse(source, field, get(field), meaning, f"{field}=0")
    attention_shift = bool(get("use_tokenshift_att")) and get("kvm_token_shift_mode") == "rwkv"
    if attention_shift != bool(get("use_tokenshift_ffn")):
        _refuse(source, "use_tokenshift_ffn", get("use_tokenshift_ffn"), "token shift on the MLP input but not on q, "
                "k, v (use_tokenshift_att with kvm_token_shift_mode='rwkv'), or the reverse",
                "token shift on both or neither")
    if get("use_value_residual") and get("kvm_value_residual_mode") != "rwkv":
        _refuse(source, "kvm_value_residual_mode", get("kvm_value_residual_mode"), "the value residual's form",
                "'rwkv' (V + σ(b + h W_down W_up) ⊙ (V1 - V)) or use_value_residual=0")
    if bool(get("kvm_use_merge_gate_keys")) != bool(get("kvm_use_merge_gate_values")):
        _refuse(source, "kvm_use_merge_gate_keys", get("kvm_use_merge_gate_keys"), "the merge gate on keys but not "
                "values, or the reverse", "a merge gate on both or neither")
    if get("state_budget_mode") not in STATE_SCHEDULES:
        _refuse(source, "state_budget_mode", get("state_budget_mode"), "the state growth schedule",
                f"{sorted(STATE_SCHEDULES)}")
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    qk_head = get("d_qk_head") or get("d_head") or hidden // heads
    v_head = get("d_v_head") or get("d_head") or hidden // heads
    if qk_head != v_head:
        _refuse(source, "d_v_head", v_head, f"value heads of another size than the q/k heads ({qk_head})",
                "one head size")
    rotary_dim = get("rope_partial_dim")
    if not (isinstance(rotary_dim, int) and 0 < rotary_dim <= qk_head and rotary_dim % 2 == 0):
        _refuse(source, "rope_partial_dim", rotary_dim, "the rotated dimensions of each head",
                f"an even number in [2, {qk_head}]")

    # only model cards read it (the context of their cache and FLOP figures): "no limit" becomes the training length
    context = get("max_position_embeddings", UNBOUNDED_CONTEXT)
    context = TRAINING_CONTEXT if context >= UNBOUNDED_CONTEXT else context
    merge_gate = bool(get("kvm_use_merge_gate_keys"))
    max_slots = get("chunk_len") * get("n_max_d_chunks")
    layers = get("num_hidden_layers")
    fields = dict(
        vocab_size=get("vocab_size"), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=qk_head,
        intermediate_size=int(get("ffn_expansion") * hidden) // 32 * 32,  # the paper's MLP width
        mlp_activation="relu2", max_position_embeddings=context, sublayer_scale=get("residual_scale"),
        bos_token_id=get("bos_token_id"), eos_token_id=get("eos_token_id"), pad_token_id=get("pad_token_id"),
        tie_word_embeddings=False,
        norm_type="layernorm", embedding_norm=True, rms_norm_eps=PAPER_NORM_EPS,
        qk_norm="layernorm", qk_norm_eps=PAPER_NORM_EPS, token_shift=attention_shift,
        rope_parameters={"rope_type": "linspace", "rope_theta": float(get("rope_theta")),
                         "partial_rotary_factor": rotary_dim / qk_head},
        rope_table_dtype="bfloat16",
        final_logit_softcapping=get("logit_softcap") or None,
        mixer_types=["kvm"] * layers,
        kvm_chunk_size=get("chunk_len"), kvm_window_chunks=get("n_bswa_chunks"),
        kvm_state_schedule=STATE_SCHEDULES[get("state_budget_mode")],
        # the paper takes max(target, min_len) and then caps at the largest state, so min_len beyond it is that cap
        kvm_state_min_slots=min(max(get("state_min_len"), 1), max_slots),
        kvm_state_max_chunks=get("n_max_d_chunks"), kvm_state_round_down=get("state_round_down"),
        kvm_growth_factor=float(get("state_growth_factor")), kvm_growth_exponent=float(get("state_growth_exponent")),
        kvm_saturation_slots=get("state_saturation_n") or KvmConfig.kvm_saturation_slots,
        kvm_sink_slots=get("sink_len"), kvm_head_temperatures=bool(get("kvm_use_head_temps")),
        kvm_merge_gate=merge_gate, kvm_merge_gate_appends=merge_gate and bool(get("kvm_apply_merge_gate_to_appends")),
        kvm_readout_radius=bool(get("kvm_use_vlens")), kvm_zero_state_rope=True,
        kvm_readout_dtype="bfloat16" if get("kvm_use_vlens") else None,  # the paper rounds r S_v / |S_v| to bf16
    )
    if get("use_value_residual") and layers > 1:
        fields.update(value_source="v1", value_mix="sigmoid_lerp", value_coefficients="learnable", value_layers="all")
    return fields


def load_kvm_paper(directory) -> KvmForCausalLM:
    """A recursal/KVM-paper checkpoint directory (config.json, model.safetensors) -> KvmForCausalLM."""
    source = f"KVM-paper checkpoint {str(directory)!r}"
    config, state_dict = read_hf_checkpoint(directory)
    fields = kvm_paper_fields(config, source)
    if fields.get("value_mix") == "sigmoid_lerp":
        fields["value_gate_rank"] = state_dict["transformer.h.1.attn.v_gate1.weight"].shape[0]
    model = KvmForCausalLM(KvmConfig(**fields))
    head_dim, rotary_dim = model.config.head_dim, model.config.rotary_dim
    permutation = paper_rotary_permutation(head_dim, rotary_dim)

    weights = {}
    for name, tensor in state_dict.items():
        if re.match(r"^transformer\.h\.0\.attn\.v_gate", name):
            continue  # layer 0's gate mixes V1 = V with itself: no effect, no place
        if name.endswith(".attn.x_v") and not fields["token_shift"]:
            continue  # a zero placeholder the paper creates for its value residual, unused without token shift
        if ROTARY_LAYOUT.search(name):  # [heads * head_dim, ...] or [head_dim]: permute within every head
            rows = tensor.reshape(-1, head_dim, *tensor.shape[1:])
            tensor = rows[:, permutation].reshape(tensor.shape)
        if name.endswith(("v_gate0", "mlp.x_k")):  # [1, 1, C] -> [C]
            tensor = tensor.reshape(-1)
        weights[name] = tensor

    def rename(name: str) -> str | None:
        for pattern, replacement in PAPER_NAMES:
            if re.search(pattern, name):
                return re.sub(pattern, replacement, name)
        return None

    return load_renamed(model, weights, rename, source)
