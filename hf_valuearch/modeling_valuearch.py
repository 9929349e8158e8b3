"""The hf_valuearch decoder: a Llama-style pre-norm transformer with three pluggable axes.

With default settings this is numerically the same model as transformers' `LlamaForCausalLM`
(the same parameter names and shapes, so checkpoints convert by renaming the config only).
The axes plug in at three places:

* value path: `ValueArchAttention.value_path` computes the values attention uses (from `h W_V`, a token table,
  x0 W_V or V1; see value_paths.py) and decides what the cache keeps; `ValueArchModel.forward` threads the
  per-forward value context (token ids, x0, V1) through the layers;
* depth routing: `ValueArchDecoderLayer.router` decides what each sublayer reads and where its output goes;
* sequence mixer: `config.mixer_types[layer_idx]` names a declaration in `cache_valuearch.SEQUENCE_MIXERS`: the
  layer's attention mask, cache layer and, for mixers with a module (KVM), the module replacing the attention
  interface, which reads and writes its own cache layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin, GenerationMode
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .cache_valuearch import SEQUENCE_MIXERS, ValueArchCache, check_cache
from .compat import CACHE_OUTPUT_FIELD, pop_cache
from .configuration_valuearch import CONFIG_CLASSES, ValueArchConfig
from .depth_routing import build_layer_router, build_readout
from .functional import repeat_kv, rms_norm
from .value_paths import (
    ValueContext,
    align_value_tables,
    build_value_context,
    build_value_path,
    projects_values,
    resize_value_tables,
    value_table_paths,
)


class ValueArchRMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich, 2019), computed in float32 as in Llama; `weight=False` drops the learnable
    weight (nanochat's `F.rms_norm(x, (d,))`)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, weight: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size)) if weight else None
        self.hidden_size = hidden_size
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        normed = rms_norm(hidden_states, self.variance_epsilon)
        return normed if self.weight is None else self.weight * normed

    def extra_repr(self):
        return f"{self.hidden_size}, eps={self.variance_epsilon}, weight={self.weight is not None}"


def build_norm(config: ValueArchConfig) -> nn.Module:
    """A backbone norm over the model width (`config.norm_type`): RMSNorm with or without its weight, or LayerNorm
    with or without weight and bias (KVM-paper's `nn.LayerNorm`)."""
    if config.norm_type == "layernorm":
        return nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps, elementwise_affine=config.norm_weights,
                            bias=config.norm_weights)
    return ValueArchRMSNorm(config.hidden_size, eps=config.rms_norm_eps, weight=config.norm_weights)


class EmbeddingSmear(nn.Module):
    """nanochat's smear gate: h_t <- h_t + λ σ(W_s h_t[:24]) h_{t-1} for t >= 1 (bigram information from the
    previous token's input; λ = `scale`, zero-initialised, W_s = `gate_proj`, U(0, 0.02)-initialised).

    With a generation cache, the pre-smear inputs of all cached positions are kept (`ValueArchCache.smear_inputs`)
    so that decode steps and cropped caches see their predecessor. Where a 2-D attention mask marks the previous
    position as padding, nothing is smeared in (nanochat has no padding: unpadded inputs are unaffected).
    """

    gate_channels = 24  # nanochat: smear_gate = Linear(24, 1)

    def __init__(self, config: ValueArchConfig):
        super().__init__()
        self.gate_proj = nn.Linear(self.gate_channels, 1, bias=False)
        self.scale = nn.Parameter(torch.zeros(1))

    def init_valuearch_weights(self, init):
        """nanochat's init: W_s ~ U(0, 0.02), λ = 0 (the smear starts closed)."""
        init.uniform_(self.gate_proj.weight, 0.0, 0.02)
        init.zeros_(self.scale)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, cache) -> torch.Tensor:
        # hidden_states: [B, T, D], the decoder input of this forward's positions
        past = cache.smear_inputs.keys if cache is not None and cache.smear_inputs.is_initialized else None
        past_length = 0 if past is None else past.shape[-2]
        if cache is not None:
            inputs = hidden_states.unsqueeze(1)  # [B, 1, T, D]
            cache.smear_inputs.update(inputs, inputs[..., :0])
        previous = hidden_states[:, :-1] if past is None else torch.cat([past[:, 0, -1:], hidden_states[:, :-1]], 1)
        current = hidden_states[:, hidden_states.shape[1] - previous.shape[1]:]  # positions with a predecessor
        if attention_mask is not None and attention_mask.dim() == 2:
            first = past_length + hidden_states.shape[1] - previous.shape[1] - 1  # index of the first predecessor
            previous = previous * attention_mask[:, first : first + previous.shape[1], None].to(previous.dtype)
        gate = self.scale * torch.sigmoid(self.gate_proj(current[..., : self.gate_channels]))  # [B, T', 1]
        smeared = current + gate * previous
        return torch.cat([hidden_states[:, : hidden_states.shape[1] - smeared.shape[1]], smeared], dim=1)


class TokenShift(nn.Module):
    """RWKV-style token shift of one stream of a layer (KVM-paper `tokenshift.py`, `config.token_shift`):
    x_t <- x_t + μ ⊙ (x_{t-1} - x_t), μ per channel (`mix`).

    Where x_{t-1} is not a token of the same sequence (its first token, or padding before it), the predecessor is
    x_t itself (`first_fallback="self"`: no shift; the paper's q, k, v) or 0 (`"zero"`; the paper's MLP input).
    With a generation cache, the stream's last position is kept in `ValueArchCache.token_shift_inputs` for the
    next step. μ starts as the paper's 1 - (c / C)^(exponent * (1 - layer / L)^power) for channel c of C.
    """

    def __init__(self, config: ValueArchConfig, layer_idx: int, name: str, channels: int, first_fallback: str,
                 exponent: float, power: int = 1):
        super().__init__()
        self.layer_idx, self.name, self.first_fallback = layer_idx, name, first_fallback
        self.init_exponent = exponent * (1.0 - layer_idx / config.num_hidden_layers) ** power
        self.mix = nn.Parameter(torch.zeros(channels))

    def init_valuearch_weights(self, init):
        channels = self.mix.shape[0]
        init.copy_(self.mix, 1.0 - (torch.arange(channels) / channels) ** self.init_exponent)

    def forward(self, x: torch.Tensor, previous_is_token: torch.Tensor, cache) -> torch.Tensor:
        # x: [B, T, C]; previous_is_token: [B, T] bool, whether x_{t-1} is a token of the same sequence
        fallback = x if self.first_fallback == "self" else torch.zeros_like(x)
        stored = cache.token_shift_inputs[self.layer_idx] if cache is not None else {}
        first = stored.get(self.name, fallback[:, :1]).to(x.dtype)  # [B, 1, C]: the last position of the cache
        if cache is not None:
            stored[self.name] = x[:, -1:].detach()
        previous = torch.where(previous_is_token[..., None], torch.cat([first, x[:, :-1]], dim=1), fallback)
        return x + self.mix * (previous - x)


def previous_is_token(attention_mask: torch.Tensor | None, past_length: int, length: int,
                      device: torch.device) -> torch.Tensor:
    """[B or 1, length] bool: whether the position before each new position is a token of the same sequence (not
    before the start, not padding per the 2D `attention_mask` [B, past_length + length])."""
    if attention_mask is not None and attention_mask.dim() == 2:
        return F.pad(attention_mask.bool(), (1, 0))[:, past_length : past_length + length]
    return (torch.arange(length, device=device) + past_length > 0)[None]


class ValueArchRotaryEmbedding(nn.Module):
    """RoPE (Su et al., 2021) over the first `config.rotary_dim` dimensions of each head.

    Frequencies by `rope_parameters["rope_type"]`: "default" (θ^(-2i/r)), "linspace" (KVM-paper's (1/θ)^(i/(n-1)))
    or any of transformers' `ROPE_INIT_FUNCTIONS`.
    """

    def __init__(self, config: ValueArchConfig):
        super().__init__()
        self.config = config
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        self.rope_type = config.rope_parameters["rope_type"]
        own_rope_types = {"default": self.compute_default_rope_parameters,
                          "linspace": self.compute_linspace_rope_parameters}
        self.rope_init_fn = own_rope_types.get(self.rope_type) or ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = self.rope_init_fn(config)
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)
        self.table_dtype = getattr(torch, config.rope_table_dtype) if config.rope_table_dtype else None

    @staticmethod
    def compute_default_rope_parameters(config: ValueArchConfig, device=None, **kwargs) -> tuple[torch.Tensor, float]:
        """inv_freq_i = theta^(-2i / rotary_dim), i < rotary_dim / 2."""
        base = config.rope_parameters["rope_theta"]
        dim = config.rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
        return inv_freq, 1.0

    @staticmethod
    def compute_linspace_rope_parameters(config: ValueArchConfig, device=None, **kwargs) -> tuple[torch.Tensor, float]:
        """inv_freq_i = (1/θ)^(i/(n-1)), i < n = rotary_dim / 2: n frequencies from 1 down to 1/θ, both included
        (KVM-paper `RotaryEmbedding`: `(1 / base) ** linspace(0, 1, n)`, float32). Equal to "default" with
        θ' = θ^(n/(n-1)) up to float32 rounding; this type gives the paper's float32 values exactly."""
        base = config.rope_parameters["rope_theta"]
        steps = config.rotary_dim // 2
        return (1 / base) ** torch.linspace(0.0, 1.0, steps=steps, dtype=torch.float32, device=device), 1.0

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, rotary_dim]
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        if self.table_dtype is not None:  # rounded as the tables of the checkpoint's training code were
            cos, sin = cos.to(self.table_dtype), sin.to(self.table_dtype)
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate the first cos.shape[-1] dimensions of q, k ([B, H, T, D]); the rest pass through."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotary_dim = cos.shape[-1]

    def rotate(x):
        if rotary_dim == x.shape[-1]:  # full RoPE: nothing passes through
            return (x * cos) + (rotate_half(x) * sin)
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        return torch.cat(((x_rot * cos) + (rotate_half(x_rot) * sin), x_pass), dim=-1)

    return rotate(q), rotate(k)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """softmax(Q K^T * scaling + mask) V, in float32 softmax; returns [B, T, H, D] and the weights."""
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def build_head_norm(config: ValueArchConfig) -> nn.Module | None:
    """Per-head normalisation of q or k (`config.qk_norm`, epsilon `qk_norm_eps`), over the head dimension."""
    if config.qk_norm == "rmsnorm":
        return ValueArchRMSNorm(config.head_dim, eps=config.qk_norm_eps, weight=config.norm_weights)
    if config.qk_norm == "layernorm":
        return nn.LayerNorm(config.head_dim, eps=config.qk_norm_eps, elementwise_affine=config.norm_weights)
    return None


class ValueArchMLP(nn.Module):
    """SwiGLU, down(act(gate(x)) * up(x)) (Shazeer, 2020), or ReLU², down(relu(up(x))^2) (So et al., 2021); with
    `token_shift`, x is first shifted toward the previous token's (KVM-paper MLP `x_k`)."""

    def __init__(self, config: ValueArchConfig, layer_idx: int):
        super().__init__()
        self.activation = config.mlp_activation
        if self.activation == "swiglu":
            self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
            self.act_fn = ACT2FN[config.hidden_act]
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.token_shift = (TokenShift(config, layer_idx, "mlp", config.hidden_size, "zero", 1.0, power=4)
                            if config.token_shift else None)

    def forward(self, x: torch.Tensor, previous_is_token: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        if self.token_shift is not None:
            x = self.token_shift(x, previous_is_token, cache)
        if self.activation == "swiglu":
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.relu(self.up_proj(x)).square())


class ValueArchAttention(nn.Module):
    """Multi-head attention with GQA, optional q/k norm, (partial) RoPE and a pluggable value path."""

    def __init__(self, config: ValueArchConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.mixer_type = config.mixer_types[layer_idx]
        self.sliding_window = config.sliding_window if SEQUENCE_MIXERS[self.mixer_type].sliding_window else None

        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        # None where the value path never reads W_V (table / V1 substitution, value_paths.projects_values)
        self.v_proj = (nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
                       if projects_values(config, layer_idx) else None)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = build_head_norm(config)
        self.k_norm = build_head_norm(config)
        if config.token_shift:  # KVM-paper x_q, x_k, x_v; exponents of its init (value_residual_mixin.py)
            self.q_token_shift = TokenShift(config, layer_idx, "q", q_dim, "self", 0.2)
            self.k_token_shift = TokenShift(config, layer_idx, "k", kv_dim, "self", 0.7)
            self.v_token_shift = TokenShift(config, layer_idx, "v", kv_dim, "self", 0.7)
        self.qk_scale = config.qk_scale  # nanochat: q, k *= 1.2 after the q/k-norm
        self.value_path = build_value_path(config, layer_idx)
        mixer_module = SEQUENCE_MIXERS[self.mixer_type].module
        self.sequence_mixer = mixer_module(config, layer_idx) if mixer_module is not None else None

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T, D], already normed
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        value_hidden_states: torch.Tensor | None = None,  # [B, T, D]: input of W_V when it differs (RD-AttnRes)
        value_context: ValueContext | None = None,  # per-forward token ids / x0 / V1 (value_paths.py)
        previous_is_token: torch.Tensor | None = None,  # [B, T] bool, with token_shift
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states)  # [B, T, H * D]
        key_states = self.k_proj(hidden_states)  # [B, T, H_kv * D]
        value_input = hidden_states if value_hidden_states is None else value_hidden_states
        value_states = self.value_path(value_input, self.v_proj, value_context)  # [B, T, H_kv, D]
        if self.config.token_shift:
            query_states = self.q_token_shift(query_states, previous_is_token, cache)
            key_states = self.k_token_shift(key_states, previous_is_token, cache)
            value_states = self.v_token_shift(value_states.flatten(2), previous_is_token, cache).view(hidden_shape)
        query_states, key_states = query_states.view(hidden_shape), key_states.view(hidden_shape)
        if self.q_norm is not None:
            query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)
        if self.qk_scale is not None:
            query_states, key_states = query_states * self.qk_scale, key_states * self.qk_scale

        query_states, key_states, value_states = (x.transpose(1, 2) for x in (query_states, key_states, value_states))
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if self.sequence_mixer is not None:
            attn_output = self.sequence_mixer(query_states, key_states, value_states, hidden_states,
                                              attention_mask, cache)
            return self.o_proj(attn_output.reshape(*input_shape, -1).contiguous()), None

        if cache is not None:
            key_states, value_states = self.value_path.update_cache(
                cache, self.layer_idx, key_states, value_states, value_context
            )

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        attn_output = self.o_proj(attn_output.reshape(*input_shape, -1).contiguous())
        return attn_output, attn_weights


class ValueArchDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: attention then MLP, each reading from and writing to depth through `router`.

    Every tensor that flows from layer to layer is a positional argument and part of the output, the only
    tensors reentrant gradient checkpointing tracks: the residual stream, the value context's x0 and V1
    (value_paths.py) and the depth state (depth_routing.py).
    """

    def __init__(self, config: ValueArchConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = ValueArchAttention(config, layer_idx)
        self.mlp = ValueArchMLP(config, layer_idx)
        self.input_layernorm = build_norm(config)
        self.post_attention_layernorm = build_norm(config)
        self.router = build_layer_router(config, layer_idx)
        self.sublayer_scale = config.sublayer_scale  # h + s f(h) (KVM-paper residual_scale); None: s = 1

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T, D], the residual stream (residual-equivalent sum under AttnRes)
        x0: torch.Tensor | None,  # [B, T, D] RMSNorm(embeddings), when a layer reads it
        v1: torch.Tensor | None,  # [B, T, H_kv, D_head] layer 0's values, once written, when a layer reads them
        *depth_state: torch.Tensor,  # what else the depth routing carries (nothing for the standard residual)
        token_ids: torch.Tensor | None = None,  # [B, T], for table layers
        previous_is_token: torch.Tensor | None = None,  # [B, T] bool, for token shift
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, ...]:  # (hidden_states, v1, *depth_state)
        value_context = ValueContext(token_ids=token_ids, x0=x0, v1=v1)
        # the router returns normed inputs (it may fuse the norm into its read); value_input None: same as attn_input
        attn_input, value_input = self.router.read_attention(hidden_states, depth_state, self.input_layernorm)
        attn_output, _ = self.self_attn(
            attn_input,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
            value_hidden_states=value_input,
            value_context=value_context,
            previous_is_token=previous_is_token,
            **kwargs,
        )
        if self.sublayer_scale is not None:
            attn_output = attn_output * self.sublayer_scale
        hidden_states, depth_state = self.router.write_attention(hidden_states, depth_state, attn_output)
        mlp_input = self.router.read_mlp(hidden_states, depth_state, self.post_attention_layernorm)
        mlp_output = self.mlp(mlp_input, previous_is_token, cache)
        if self.sublayer_scale is not None:
            mlp_output = mlp_output * self.sublayer_scale
        hidden_states, depth_state = self.router.write_mlp(hidden_states, depth_state, mlp_output)
        return hidden_states, value_context.v1, *depth_state


class ValueArchPreTrainedModel(PreTrainedModel):
    config: ValueArchConfig
    config_class = ValueArchConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["ValueArchDecoderLayer"]
    _skip_keys_device_placement = [CACHE_OUTPUT_FIELD]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": ValueArchDecoderLayer, "attentions": ValueArchAttention}

    def _init_weights(self, module):
        if isinstance(module, ValueArchRotaryEmbedding):  # our own rope types included (transformers knows "default")
            inv_freq, _ = module.rope_init_fn(module.config, device=module.inv_freq.device)
            init.copy_(module.inv_freq, inv_freq)
            init.copy_(module.original_inv_freq, inv_freq)
            return
        super()._init_weights(module)
        if hasattr(module, "init_valuearch_weights"):  # mechanism parameters transformers does not know
            module.init_valuearch_weights(init)

    def initialize_weights(self):
        """Initialise as transformers does (then as nanochat does, with `initialization="nanochat"`), then align
        the BoV value tables this call initialised (neither loaded nor initialised before: transformers'
        per-module `_is_hf_initialized` flag, which `init` also respects for the nanochat scheme)."""
        base_model = self if isinstance(self, ValueArchModel) else self.model
        fresh = [i for i, path in value_table_paths(base_model).items()
                 if not getattr(path.value_table, "_is_hf_initialized", False)]
        super().initialize_weights()
        if self.config.initialization == "nanochat":
            init_nanochat_weights(self)
        align_value_tables(base_model, layers=fresh)

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resize as transformers does; the BoV value tables follow the vocabulary (`resize_value_tables`)."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        resize_value_tables(self if isinstance(self, ValueArchModel) else self.model, embeddings.num_embeddings)
        return embeddings

    @property
    def _can_compile_fullgraph(self) -> bool:
        """Whether torch.compile(fullgraph=True) and torch.export trace every forward in one graph: yes unless a
        layer's sequence mixer says otherwise (`SequenceMixer.compiles_fullgraph`; KVM's padded batches split)."""
        return all(SEQUENCE_MIXERS[mixer].compiles_fullgraph for mixer in set(self.config.mixer_types))

    def valuearch_diagnostics(self) -> dict[str, dict]:
        """Every mechanism's diagnostics, `{module name: module.diagnostics()}`.

        Mechanism modules (value paths, depth routers, KVM mixers) define `diagnostics()`, returning plain
        numbers or CPU tensors: learned coefficients, and statistics recorded during the last forward.
        """
        return {name: module.diagnostics() for name, module in self.named_modules()
                if module is not self and callable(getattr(module, "diagnostics", None))}

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save as transformers does, with `AutoModel` added to the remote-code `auto_map`."""
        base_model = self if isinstance(self, ValueArchModel) else self.model
        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}),
                                "AutoModel": f"modeling_valuearch.{type(base_model).__name__}"}
        return super().save_pretrained(save_directory, *args, **kwargs)


class ValueArchModel(ValueArchPreTrainedModel):
    """The decoder without a head: embeddings, layers, final RMSNorm."""

    def __init__(self, config: ValueArchConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.embedding_norm = build_norm(config) if config.embedding_norm else None
        self.smear = EmbeddingSmear(config) if config.smear_gate else None
        self.layers = nn.ModuleList([ValueArchDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.readout = build_readout(config)
        self.norm = build_norm(config)
        self.rotary_emb = ValueArchRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    def _attention_masks(self, inputs_embeds, attention_mask, cache, position_ids) -> dict:
        """One mask per sequence mixer present in the model."""
        return {
            mixer: SEQUENCE_MIXERS[mixer].mask(self.config, inputs_embeds, attention_mask, cache, position_ids)
            for mixer in set(self.config.mixer_types)
        }

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        cache = pop_cache(cache, kwargs)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("ValueArchModel.forward needs exactly one of input_ids or inputs_embeds.")
        if input_ids is not None:
            # one host sync in eager mode; not while torch.compile / torch.export trace (a data-dependent branch)
            if not torch.compiler.is_compiling() and ((input_ids < 0) | (input_ids >= self.config.vocab_size)).any():
                raise ValueError(
                    f"input_ids must lie in [0, vocab_size={self.config.vocab_size}); got values in "
                    f"[{int(input_ids.min())}, {int(input_ids.max())}]."
                )
            inputs_embeds = self.embed_tokens(input_ids)

        if kwargs.get("output_attentions", self.config.output_attentions):
            for mixer in dict.fromkeys(self.config.mixer_types):
                module = SEQUENCE_MIXERS[mixer].module  # a mixer's own module returns no attention weights
                if module is not None:
                    reason = getattr(module, "no_attention_weights", f"{mixer!r} layers return no attention weights")
                    raise ValueError(f"output_attentions=True: {reason} to return; call without output_attentions.")
        check_cache(self.config, cache)
        if use_cache and cache is None:
            cache = ValueArchCache(self.config)
        past_seen_tokens = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            position_ids = position_ids.unsqueeze(0)
        shift_mask = (previous_is_token(attention_mask, past_seen_tokens, inputs_embeds.shape[1], inputs_embeds.device)
                      if self.config.token_shift else None)

        masks = self._attention_masks(inputs_embeds, attention_mask, cache, position_ids)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)

        hidden_states = inputs_embeds
        if self.embedding_norm is not None:
            hidden_states = self.embedding_norm(hidden_states)
        if self.smear is not None:
            hidden_states = self.smear(hidden_states, attention_mask, cache)
        value_context = build_value_context(self, input_ids, hidden_states)
        hidden_states, depth_state = self.readout.start(hidden_states)
        v1 = None
        for layer in self.layers:
            hidden_states, v1, *depth_state = layer(
                hidden_states,
                value_context.x0,
                v1,
                *depth_state,
                token_ids=value_context.token_ids,
                previous_is_token=shift_mask,
                attention_mask=masks[layer.self_attn.mixer_type],
                position_embeddings=position_embeddings,
                cache=cache,
                **kwargs,
            )
        hidden_states = self.readout.finish(hidden_states, depth_state, self.norm)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, **{CACHE_OUTPUT_FIELD: cache})


class ValueArchForCausalLM(ValueArchPreTrainedModel, GenerationMixin):
    """The decoder with a language-modelling head (tied to the embeddings if `tie_word_embeddings`)."""

    base_model_class = ValueArchModel  # each named architecture pairs its own base model class
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}
    _fsdp_plan = {"lm_head": "keep_full_weight"}

    def __init__(self, config: ValueArchConfig):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, generation_mode,
                                      batch_size: int, max_cache_length: int) -> None:
        """`generate`'s hook for building the cache: ours is a `ValueArchCache` (per-layer cache classes that
        `DynamicCache` cannot express); assisted decoding needs it croppable (KVM layers and token shift are not)."""
        implementation = generation_config.cache_implementation
        if implementation not in (None, "dynamic"):
            raise ValueError(
                f"cache_implementation={implementation!r} is not supported by {type(self).__name__}: it generates "
                "with its own ValueArchCache (per-layer cache classes); leave cache_implementation unset."
            )
        if generation_mode == GenerationMode.ASSISTED_GENERATION:
            reason = ValueArchCache(self.config).not_croppable_reason()
            if reason is not None:
                raise ValueError(reason)
        if model_kwargs.get(CACHE_OUTPUT_FIELD) is not None or generation_config.use_cache is False:
            return super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode,
                                                         batch_size, max_cache_length)
        cache = ValueArchCache(self.config)
        if generation_config.is_assistant:  # the assistant's drafts are cropped after verification
            cache.activate_past_recording()
        model_kwargs[CACHE_OUTPUT_FIELD] = cache

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        cache = pop_cache(cache, kwargs)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, slice_indices, :])
        if self.config.final_logit_softcapping is not None:
            cap = self.config.final_logit_softcapping
            logits = cap * torch.tanh(logits / cap)

        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **{CACHE_OUTPUT_FIELD: getattr(outputs, CACHE_OUTPUT_FIELD)},
        )


def init_nanochat_weights(model: ValueArchPreTrainedModel):
    """nanochat's initialisation (karpathy/nanochat gpt.py `init_weights`, config.initialization="nanochat"), with
    s = √3 / √hidden_size: W_Q, W_K, W_V ~ U(±s); up (and gate) projections ~ U(±0.4 s); attention and MLP output
    projections 0; embeddings ~ N(0, 0.8); an untied LM head ~ N(0, 0.001). Other modules keep their own init;
    `init` skips weights loaded from a checkpoint."""
    config = model.config
    bound = 3**0.5 * config.hidden_size**-0.5
    for module in model.modules():
        if isinstance(module, ValueArchAttention):
            for projection in (module.q_proj, module.k_proj, module.v_proj):  # v_proj is None at BoV table layers
                if projection is not None:
                    init.uniform_(projection.weight, -bound, bound)
            init.zeros_(module.o_proj.weight)
        elif isinstance(module, ValueArchMLP):
            for projection in (getattr(module, "gate_proj", None), module.up_proj):
                if projection is not None:
                    init.uniform_(projection.weight, -0.4 * bound, 0.4 * bound)
            init.zeros_(module.down_proj.weight)
        elif isinstance(module, ValueArchModel):
            init.normal_(module.embed_tokens.weight, mean=0.0, std=0.8)
        elif isinstance(module, ValueArchForCausalLM) and not config.tie_word_embeddings:
            init.normal_(module.lm_head.weight, mean=0.0, std=0.001)


# --- named architectures: two model classes per preset, derived from its config class (presets.py) ---------


def preset_model_classes(config_class: type[ValueArchConfig]) -> tuple[type[ValueArchModel],
                                                                        type[ValueArchForCausalLM]]:
    """`{class_prefix}Model` and `{class_prefix}ForCausalLM` of a preset's config class (transformers maps one
    model class per config class)."""
    prefix = config_class.__name__.removesuffix("Config")
    model_class = type(f"{prefix}Model", (ValueArchModel,), {
        "__module__": __name__, "config_class": config_class, "__doc__": f"{ValueArchModel.__doc__} ({prefix})"})
    lm_class = type(f"{prefix}ForCausalLM", (ValueArchForCausalLM,), {
        "__module__": __name__, "config_class": config_class, "base_model_class": model_class,
        "__doc__": f"{ValueArchForCausalLM.__doc__} ({prefix})"})
    return model_class, lm_class


# model_type -> (base model class, causal-LM class); the named ones are module-level names (BovModel,
# BovForCausalLM, ...) because a saved checkpoint's `auto_map` names them, e.g. "modeling_valuearch.BovForCausalLM".
MODEL_CLASSES: dict[str, tuple[type[ValueArchModel], type[ValueArchForCausalLM]]] = {
    model_type: (ValueArchModel, ValueArchForCausalLM) if config_class is ValueArchConfig
    else preset_model_classes(config_class)
    for model_type, config_class in CONFIG_CLASSES.items()
}
globals().update({cls.__name__: cls for classes in MODEL_CLASSES.values() for cls in classes})

__all__ = ["ValueArchPreTrainedModel", "MODEL_CLASSES",
           *(cls.__name__ for classes in MODEL_CLASSES.values() for cls in classes)]
