"""Configuration of the hf_valuearch decoder: one Llama-style backbone, three orthogonal axes.

The backbone is a pre-norm decoder (RMSNorm, RoPE, SwiGLU, GQA, no biases). Three independent axes
choose what changes (see ``README.md`` / design):

1. value path (``value_source`` + mixing fields): where a layer's attention values come from;
2. depth routing (``depth_routing``): what each sublayer reads from depth;
3. sequence mixer (``mixer_types``, one entry per layer): what attention reads from the past.

Named architectures are subclasses that only change defaults, each with its own ``model_type``; they are
derived at the end of this file from their declarations in ``presets.py``.
Every invalid field raises ``ValueError`` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import math

from transformers.configuration_utils import PreTrainedConfig

from .cache_valuearch import SEQUENCE_MIXERS
from .presets import PRESETS, Preset

# --- allowed values of each axis ------------------------------------------------------------------
VALUE_SOURCES = ("residual", "table", "x0", "v1")
VALUE_MIXES = ("substitute", "add", "relu_gate", "sigmoid_lerp")
VALUE_COEFFICIENTS = ("fixed", "learnable")
VALUE_LAYER_SETS = ("all", "every_other", "last_third")
DEPTH_ROUTINGS = ("standard", "block_attnres", "rd_attnres")
VALUE_ROUTES = ("learned", "tied", "average", "frozen")  # RD-AttnRes V-route query (depth_routing.py)
KVM_STATE_SCHEDULES = ("fixed", "power_law", "saturating")
NORM_TYPES = ("rmsnorm", "layernorm")
QK_NORMS = ("none", "rmsnorm", "layernorm")
MLP_ACTIVATIONS = ("swiglu", "relu2")
INITIALIZATIONS = ("normal", "nanochat")
ROPE_TABLE_DTYPES = ("bfloat16",)  # also the allowed kvm_readout_dtype


def _fail(field: str, value, allowed: str):
    raise ValueError(f"ValueArchConfig.{field}={value!r} is invalid: {allowed}.")


def _check_int(field: str, value, minimum: int = 1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(field, value, f"expected an integer >= {minimum}")


def _check_float(field: str, value, minimum: float = 0.0, strictly: bool = False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > minimum if strictly else value >= minimum)
    if not ok:
        _fail(field, value, f"expected a number {'>' if strictly else '>='} {minimum}")


def _check_choice(field: str, value, allowed: tuple[str, ...]):
    if value not in allowed:
        _fail(field, value, f"allowed values are {list(allowed)}")


class ValueArchConfig(PreTrainedConfig):
    r"""Configuration of [`ValueArchModel`] and [`ValueArchForCausalLM`].

    With its defaults it describes a standard Llama decoder: `LlamaConfig` fields keep their names and
    meanings, so a Llama checkpoint's config converts field by field (see `scripts/convert.py`).

    Decoder options (all off by default, i.e. Llama behaviour):
        qk_norm: per-head normalisation of q and k after projection, before RoPE: "none", "rmsnorm" or
            "layernorm" (KVM backbone, SATFormer).
        qk_norm_eps: epsilon of the q/k norms; None = `rms_norm_eps` (SATFormer and KVM use 1e-5 there).
        norm_type: the backbone's norms (embedding norm, the two pre-norms of every block, the final norm):
            "rmsnorm" (Llama) or "layernorm" (LayerNorm with bias, KVM-paper's `nn.LayerNorm`); `rms_norm_eps` is
            their epsilon either way, `norm_weights` their affine parameters.
        qk_scale: q and k are multiplied by this after the q/k-norm (nanochat: 1.2); needs `qk_norm`.
        norm_weights: False drops the learnable weight of every RMSNorm (and the q/k norms' affine
            parameters): nanochat's parameter-free `F.rms_norm`.
        embedding_norm: RMSNorm of the embeddings before the first layer (nanochat `x = norm(wte(idx))`).
        smear_gate: nanochat's smear, h_t += λ σ(W_s h_t[:24]) h_{t-1} on the decoder input (λ zero-init).
        sublayer_scale: None, or s: each attention and MLP output is multiplied by s before it joins the
            residual stream, h + s f(h) (KVM-paper `residual_scale`: 0.5 in its 350M configs).
        token_shift: RWKV-style token shift (KVM-paper `use_tokenshift_att` and `use_tokenshift_ffn`): per channel,
            x_t <- x_t + μ ⊙ (x_{t-1} - x_t) on q, k and v after their projections (v after the value path) and
            on the MLP input; at a sequence's first token q, k, v keep their own value and the MLP input's
            predecessor is 0. A generation cache keeps each layer's last q, k, v and MLP input.
        initialization: "normal" (Llama: N(0, initializer_range)) or "nanochat" (U(±√3/√d) q/k/v, 0.4× for
            the MLP input, zero output projections, embeddings N(0, 0.8), LM head N(0, 0.001)).
        mlp_activation: "swiglu" (Llama) or "relu2" (`down(relu(up(x))^2)`, nanochat / KVM backbone).
        final_logit_softcapping: if set to c, logits become `c * tanh(logits / c)` (nanochat: 15).
        rope_parameters["partial_rotary_factor"]: fraction of each head's dimensions that RoPE rotates
            (the first ones); the rest carry no position (KVM: 0.5). rope_type "linspace": KVM-paper's
            frequencies (1/θ)^linspace(0, 1, n).
        rope_table_dtype: None, or "bfloat16" to round the cos/sin tables to bf16 before use, whatever the
            activations' dtype (KVM-paper's RotaryEmbedding does, so its checkpoints load exactly).

    Axes:
        value_source: where attention values come from at the layers in `value_layers` (spec_value_paths.md):
            "residual" (`V = h W_V`), "table" (a per-layer token-id table `E_V`, BoV), "x0" (`RMSNorm(e) W_V`
            with the layer's own W_V), "v1" (layer 0's values V1).
        value_mix: "substitute" (`gamma * V~`), "add" (`alpha * V + beta * V~`) or "relu_gate"
            (`V + ReLU(h W_alpha) * V1`, SATFormer) or "sigmoid_lerp" (`V + σ(b + h W_down W_up) ⊙ (V1 - V)`,
            KVM-paper's RWKV-style value residual, gate per channel); the last two only with value_source="v1".
        value_gate_rank: (sigmoid_lerp) the rank of the gate's low-rank projection W_down W_up.
        value_coefficients: "fixed" or "learnable" (unbounded scalars per layer: gamma, or alpha and beta).
        value_coefficient_init: initial (or fixed) coefficients: [gamma] for "substitute", [alpha, beta] for
            "add"; None = [1.0] / [0.5, 0.5]. Must stay None for "relu_gate" and "sigmoid_lerp".
        value_layers: which layers use the value path: "all", "every_other" (nanochat `has_ve`: the layers
            with the last layer's parity), "last_third" (`layer_idx >= 2 * L // 3`) or an explicit list of
            layer indices; None (only with value_source="residual") is the standard transformer. Layer 0
            never reads V1 (it produces it).
        depth_routing: how sublayers read depth: "standard" residual stream, "block_attnres" (Block
            Attention Residuals) or "rd_attnres" (Role-Decoupled AttnRes); see depth_routing.py.
        attnres_block_size: (block_attnres, rd_attnres) sublayers per block; an attention or MLP sublayer
            counts as one, so 1 is Full AttnRes.
        value_route: (rd_attnres) the V route: "learned" (its own query), "tied" (the Q/K route: Block AttnRes),
            "average" (both routes run, ½(h_QK + h_V) feeds Q, K and V) or "frozen" (a uniform mean).
        mixer_types: per layer, "full_attention", "sliding_attention" (window `sliding_window`) or "kvm"
            (Key-Value Means, fields `kvm_*`, see `kvm.py`).
    """

    model_type = "valuearch"
    default_mixer_type = "full_attention"  # every layer's mixer when `mixer_types` is not given
    partial_rotary_factor = None  # the rotary fraction when `rope_parameters` lacks one (None: the whole head)
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    # --- backbone (LlamaConfig names and defaults) ---
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    # --- decoder options ---
    qk_norm: str = "none"
    qk_norm_eps: float | None = None  # None: rms_norm_eps
    qk_scale: float | None = None
    norm_type: str = "rmsnorm"
    norm_weights: bool = True
    embedding_norm: bool = False
    smear_gate: bool = False
    sublayer_scale: float | None = None
    token_shift: bool = False
    initialization: str = "normal"
    rope_table_dtype: str | None = None
    mlp_activation: str = "swiglu"
    final_logit_softcapping: float | None = None
    # --- axis 1: value path ---
    value_source: str = "residual"
    value_mix: str = "substitute"
    value_coefficients: str = "fixed"
    value_coefficient_init: list[float] | None = None
    value_layers: str | list[int] | None = None
    value_gate_rank: int | None = None
    # --- axis 2: depth routing ---
    depth_routing: str = "standard"
    attnres_block_size: int | None = None
    value_route: str | None = None
    # --- axis 3: sequence mixer ---
    # `mixer_types` and not transformers' `layer_types`: transformers checks `layer_types` against its own
    # allow-list (ALLOWED_ATTN_LAYER_TYPES, which has no "kvm": such a config fails to save) and its mask and cache
    # helpers dispatch on those values; our layers take mask, cache layer and module from
    # cache_valuearch.SEQUENCE_MIXERS[mixer_types[i]] instead.
    mixer_types: list[str] | None = None
    sliding_window: int | None = None
    # --- KVM layers (mixer "kvm"; Goldstein & Cheah, arXiv:2605.09877; defaults: spec_kvm.md A.2-A.4, A.7) ---
    kvm_chunk_size: int = 256  # C, `chunk_len`
    kvm_window_chunks: int = 2  # n_w, `n_bswa_chunks`: the raw-token window holds n_w chunks incl. the current one
    kvm_state_schedule: str = "fixed"  # growth of the state: "fixed", "power_law" (f*T^e) or "saturating" (N*T/(N+T))
    kvm_state_min_slots: int = 256  # `state_min_len`
    kvm_state_max_chunks: int = 1  # `n_max_d_chunks`: at most C * this many state slots
    kvm_state_round_down: int = 1  # `state_round_down`: growth targets are rounded down to a multiple of this
    kvm_growth_factor: float = 16.0  # f of "power_law" (`state_growth_factor`)
    kvm_growth_exponent: float = 0.5  # e of "power_law" (`state_growth_exponent`)
    kvm_saturation_slots: int = 1024  # N of "saturating" (`state_saturation_n`)
    kvm_sink_slots: int = 1  # `sink_len`: leading state slots that never receive merges
    kvm_head_temperatures: bool = True  # `kvm_use_head_temps`: per-head state / window key temperatures
    kvm_merge_gate: bool = True  # `kvm_use_merge_gate_{keys,values}`: g = 1 + ELU(w . x) on merged keys and values
    kvm_merge_gate_appends: bool = True  # `kvm_apply_merge_gate_to_appends`: the gate also scales appended slots
    kvm_readout_radius: bool = True  # `kvm_use_vlens`: value readout r*S_v/|S_v|; False: the mean S_v/n
    kvm_zero_state_rope: bool = True  # state keys zero the rotary dims before the state LayerNorm (A.2)
    # None, or "bfloat16": the state's readout values V^ are rounded to bf16 whatever the activations' dtype, as
    # KVM-paper's readout with radius does (`.bfloat16()` in `_attend_with_state_and_bswa`; set to load its checkpoints)
    kvm_readout_dtype: str | None = None

    def __post_init__(self, **kwargs):
        if self.head_dim is None and isinstance(self.num_attention_heads, int) and self.num_attention_heads > 0:
            if isinstance(self.hidden_size, int) and self.hidden_size % self.num_attention_heads == 0:
                self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.qk_norm_eps is None:
            self.qk_norm_eps = self.rms_norm_eps
        if self.mixer_types is None and isinstance(self.num_hidden_layers, int):
            self.mixer_types = [self.default_mixer_type] * self.num_hidden_layers
        super().__post_init__(**kwargs)
        self.validate_valuearch()

    def validate(self):
        """transformers' checks, then `validate_valuearch`; `save_pretrained` calls this, so a field changed after
        construction is checked before it is saved."""
        super().validate()
        self.validate_valuearch()

    def _validate_linspace_rope_parameters(self, rope_parameters: dict, ignore_keys: set | None = None):
        """rope_type "linspace" (KVM-paper frequencies, `ValueArchRotaryEmbedding`) takes the keys of "default"."""
        self._validate_default_rope_parameters(rope_parameters, ignore_keys=ignore_keys)

    @property
    def rotary_dim(self) -> int:
        """Number of leading dimensions of each head that RoPE rotates (even)."""
        factor = self.rope_parameters.get("partial_rotary_factor", 1.0)
        return int(self.head_dim * factor)

    def validate_valuearch(self):
        """Raise ValueError on any field value or combination that has no meaning."""
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            _check_int(field, getattr(self, field))
        if self.hidden_size % self.num_attention_heads != 0 and self.head_dim is None:
            _fail("num_attention_heads", self.num_attention_heads,
                  f"must divide hidden_size={self.hidden_size} (or set head_dim explicitly)")
        _check_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            _fail("head_dim", self.head_dim, "must be even for rotary embeddings")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            _fail("num_key_value_heads", self.num_key_value_heads,
                  f"must divide num_attention_heads={self.num_attention_heads}")
        _check_float("rms_norm_eps", self.rms_norm_eps, 0.0, strictly=True)
        _check_float("initializer_range", self.initializer_range)
        if not (isinstance(self.attention_dropout, (int, float)) and 0.0 <= self.attention_dropout < 1.0):
            _fail("attention_dropout", self.attention_dropout, "expected a number in [0, 1)")
        _check_choice("qk_norm", self.qk_norm, QK_NORMS)
        _check_float("qk_norm_eps", self.qk_norm_eps, 0.0, strictly=True)
        if self.qk_scale is not None:
            _check_float("qk_scale", self.qk_scale, 0.0, strictly=True)
            if self.qk_norm == "none":
                _fail("qk_scale", self.qk_scale, "scales q and k after the q/k-norm; set qk_norm or use None")
        _check_choice("norm_type", self.norm_type, NORM_TYPES)
        if self.sublayer_scale is not None:
            _check_float("sublayer_scale", self.sublayer_scale, 0.0, strictly=True)
        for field in ("norm_weights", "embedding_norm", "smear_gate", "token_shift"):
            if not isinstance(getattr(self, field), bool):
                _fail(field, getattr(self, field), "expected True or False")
        if self.smear_gate and self.hidden_size < 24:
            _fail("smear_gate", True, f"its gate reads the first 24 channels; hidden_size={self.hidden_size} is smaller")
        _check_choice("initialization", self.initialization, INITIALIZATIONS)
        if self.rope_table_dtype is not None:
            _check_choice("rope_table_dtype", self.rope_table_dtype, ROPE_TABLE_DTYPES)
        _check_choice("mlp_activation", self.mlp_activation, MLP_ACTIVATIONS)
        if self.final_logit_softcapping is not None:
            _check_float("final_logit_softcapping", self.final_logit_softcapping, 0.0, strictly=True)
        factor = self.rope_parameters.get("partial_rotary_factor", 1.0)
        if not (isinstance(factor, (int, float)) and 0.0 < factor <= 1.0):
            _fail("rope_parameters['partial_rotary_factor']", factor, "expected a number in (0, 1]")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            _fail("rope_parameters['partial_rotary_factor']", factor,
                  f"head_dim * factor = {self.head_dim * factor} must be an even number >= 2")
        if self.pad_token_id is not None and not (0 <= self.pad_token_id < self.vocab_size):
            _fail("pad_token_id", self.pad_token_id, f"expected None or an id in [0, {self.vocab_size})")

        self.validate_value_path()
        if self.token_shift and self.value_source == "table" and self.value_mix == "substitute":
            _fail("token_shift", True, "must be False with BoV table layers (value_source='table', value_mix="
                  "'substitute'): their cache keeps token ids and recomputes unshifted values from them")
        _check_choice("depth_routing", self.depth_routing, DEPTH_ROUTINGS)
        if self.norm_type == "layernorm" and self.depth_routing != "standard":
            _fail("norm_type", "layernorm", f"must be 'rmsnorm' with depth_routing={self.depth_routing!r}, whose "
                  "depth read fuses an RMSNorm pre-norm (or use depth_routing='standard')")
        if self.depth_routing == "standard":
            if self.attnres_block_size is not None:
                _fail("attnres_block_size", self.attnres_block_size,
                      "only meaningful with depth_routing 'block_attnres' or 'rd_attnres'; use None")
        else:
            _check_int("attnres_block_size", self.attnres_block_size)
        if self.depth_routing == "rd_attnres":
            _check_choice("value_route", self.value_route, VALUE_ROUTES)
        elif self.value_route is not None:
            _fail("value_route", self.value_route, "only meaningful with depth_routing 'rd_attnres'; use None")

        if not isinstance(self.mixer_types, (list, tuple)) or len(self.mixer_types) != self.num_hidden_layers:
            _fail("mixer_types", self.mixer_types,
                  f"expected a list of {self.num_hidden_layers} entries (one per layer) from {list(SEQUENCE_MIXERS)}")
        self.mixer_types = list(self.mixer_types)
        for mixer in self.mixer_types:
            _check_choice("mixer_types", mixer, tuple(SEQUENCE_MIXERS))
        windowed = sorted(name for name, mixer in SEQUENCE_MIXERS.items() if mixer.sliding_window)
        if any(mixer in windowed for mixer in self.mixer_types):
            _check_int("sliding_window", self.sliding_window)
        elif self.sliding_window is not None:
            _fail("sliding_window", self.sliding_window, f"must be None unless a layer is one of {windowed}")
        if "kvm" in self.mixer_types:
            self.validate_kvm()

    def validate_kvm(self):
        """Fields of KVM layers (spec_kvm.md A.2-A.4); only checked when a layer is "kvm"."""
        for field in ("kvm_chunk_size", "kvm_window_chunks", "kvm_state_min_slots", "kvm_state_max_chunks",
                      "kvm_state_round_down", "kvm_saturation_slots"):
            _check_int(field, getattr(self, field))
        _check_int("kvm_sink_slots", self.kvm_sink_slots, minimum=0)
        for field in ("kvm_head_temperatures", "kvm_merge_gate", "kvm_merge_gate_appends", "kvm_readout_radius",
                      "kvm_zero_state_rope"):
            if not isinstance(getattr(self, field), bool):
                _fail(field, getattr(self, field), "expected True or False")
        _check_choice("kvm_state_schedule", self.kvm_state_schedule, KVM_STATE_SCHEDULES)
        if self.kvm_readout_dtype is not None:
            _check_choice("kvm_readout_dtype", self.kvm_readout_dtype, ROPE_TABLE_DTYPES)
        _check_float("kvm_growth_factor", self.kvm_growth_factor, 0.0, strictly=True)
        exponent = self.kvm_growth_exponent
        if not (isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and 0.0 < exponent <= 1.0):
            _fail("kvm_growth_exponent", exponent, "expected a number in (0, 1]")
        max_slots = self.kvm_chunk_size * self.kvm_state_max_chunks
        if self.kvm_state_min_slots > max_slots:
            _fail("kvm_state_min_slots", self.kvm_state_min_slots,
                  f"must be <= kvm_chunk_size * kvm_state_max_chunks = {max_slots} (the largest state)")
        if self.kvm_sink_slots >= self.kvm_chunk_size:
            _fail("kvm_sink_slots", self.kvm_sink_slots,
                  f"must be < kvm_chunk_size={self.kvm_chunk_size}: the initial state (one chunk) needs a "
                  "non-sink slot to merge into")
        if self.kvm_merge_gate_appends and not self.kvm_merge_gate:
            _fail("kvm_merge_gate_appends", True, "only meaningful with kvm_merge_gate=True; set both to False")
        if self.kvm_zero_state_rope and self.rotary_dim == self.head_dim:
            _fail("kvm_zero_state_rope", True,
                  f"RoPE covers the whole head (rotary_dim = head_dim = {self.head_dim}), so zeroing it would leave "
                  "state keys empty; use partial rotary (rope_parameters['partial_rotary_factor'] < 1) or set "
                  "kvm_zero_state_rope=False")

    def validate_value_path(self):
        """Axis 1: the value-path fields and their combinations (spec_value_paths.md)."""
        _check_choice("value_source", self.value_source, VALUE_SOURCES)
        _check_choice("value_mix", self.value_mix, VALUE_MIXES)
        _check_choice("value_coefficients", self.value_coefficients, VALUE_COEFFICIENTS)
        if self.value_layers is None:
            if self.value_source != "residual":
                _fail("value_layers", None, f"value_source={self.value_source!r} needs a layer set: "
                      f"one of {list(VALUE_LAYER_SETS)} or a list of layer indices")
            for field, default in (("value_mix", "substitute"), ("value_coefficients", "fixed"),
                                   ("value_coefficient_init", None), ("value_gate_rank", None)):
                if getattr(self, field) != default:
                    _fail(field, getattr(self, field), "the standard value path (value_source='residual', "
                          f"value_layers=None) has no mixing; leave it at {default!r} or set value_layers")
            return
        if isinstance(self.value_layers, str):
            _check_choice("value_layers", self.value_layers, VALUE_LAYER_SETS)
        else:
            layers = self.value_layers
            if (not isinstance(layers, (list, tuple)) or not layers
                    or any(isinstance(i, bool) or not isinstance(i, int) for i in layers)
                    or len(set(layers)) != len(layers)
                    or not all(0 <= i < self.num_hidden_layers for i in layers)):
                _fail("value_layers", layers, f"expected one of {list(VALUE_LAYER_SETS)} or a non-empty list of "
                      f"distinct layer indices in [0, {self.num_hidden_layers})")
            self.value_layers = sorted(layers)
            if self.value_source == "v1" and 0 in layers:
                _fail("value_layers", layers, "layer 0 produces V1 and cannot read it; use indices >= 1")
        if not self.value_layer_indices:
            _fail("value_layers", self.value_layers,
                  f"selects no layer for value_source={self.value_source!r} with {self.num_hidden_layers} layers")
        if self.value_source == "residual":
            if self.value_mix != "substitute" or self.value_coefficients != "learnable":
                _fail("value_mix" if self.value_mix != "substitute" else "value_coefficients",
                      self.value_mix if self.value_mix != "substitute" else self.value_coefficients,
                      "value_source='residual' on value_layers only means a learnable scale gamma * V "
                      "(BoV Table 1 row 2): value_mix='substitute' with value_coefficients='learnable'")
        if self.value_mix == "sigmoid_lerp":
            _check_int("value_gate_rank", self.value_gate_rank)
        elif self.value_gate_rank is not None:
            _fail("value_gate_rank", self.value_gate_rank, "only meaningful with value_mix='sigmoid_lerp'; use None")
        if self.value_mix in ("relu_gate", "sigmoid_lerp"):
            if self.value_source != "v1":
                _fail("value_mix", self.value_mix, "this gate mixes V1 only; needs value_source='v1'")
            if self.value_coefficients != "learnable":
                _fail("value_coefficients", self.value_coefficients,
                      f"value_mix={self.value_mix!r} is a learned gate; use 'learnable'")
            if self.value_coefficient_init is not None:
                _fail("value_coefficient_init", self.value_coefficient_init,
                      f"value_mix={self.value_mix!r} has no scalar coefficients (its gate is a linear layer); use None")
            return
        count = 1 if self.value_mix == "substitute" else 2
        init = self.value_coefficient_init
        if init is not None and (
            not isinstance(init, (list, tuple)) or len(init) != count
            or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in init)
        ):
            _fail("value_coefficient_init", init, f"value_mix={self.value_mix!r} takes None or {count} finite "
                  f"number(s): {'[gamma]' if count == 1 else '[alpha, beta]'}")
        if init is not None:
            self.value_coefficient_init = [float(c) for c in init]

    @property
    def value_layer_indices(self) -> list[int]:
        """The layers whose values come from the value path (empty for the standard transformer)."""
        layers, n = self.value_layers, self.num_hidden_layers
        if layers is None:
            return []
        if layers == "all":
            indices = list(range(n))
        elif layers == "every_other":  # nanochat has_ve: the last layer is always included
            indices = [i for i in range(n) if i % 2 == (n - 1) % 2]
        elif layers == "last_third":  # BoV: layer_idx >= 2 * n_layer // 3
            indices = list(range(2 * n // 3, n))
        else:
            indices = list(layers)
        return [i for i in indices if not (self.value_source == "v1" and i == 0)]

    @property
    def value_coefficient_values(self) -> list[float]:
        """The initial (or fixed) coefficients: [gamma] for "substitute", [alpha, beta] for "add"."""
        if self.value_coefficient_init is not None:
            return list(self.value_coefficient_init)
        return [1.0] if self.value_mix == "substitute" else [0.5, 0.5]


# --- named architectures: one config class per preset, derived from its declaration in presets.py -------------


def preset_config_class(preset: Preset) -> type[ValueArchConfig]:
    """`{class_prefix}Config`: a `ValueArchConfig` whose defaults are `preset.defaults`, registered as its own
    `model_type` (transformers needs one config class per model type)."""
    name = f"{preset.class_prefix}Config"
    namespace = {"__module__": __name__, "__qualname__": name, "__annotations__": {},
                 "model_type": preset.model_type, "__doc__": f"{preset.mechanism} ({preset.paper.title}, "
                 f"arXiv:{preset.paper.arxiv}).\n\n{preset.summary}\n\nDefaults: {preset.defaults}"}
    for field_name, value in preset.defaults.items():
        if field_name in ValueArchConfig.__dataclass_fields__:
            namespace["__annotations__"][field_name] = ValueArchConfig.__dataclass_fields__[field_name].type
            # a list or dict default is given to every instance as its own copy
            namespace[field_name] = (dataclasses.field(default_factory=lambda v=value: copy.deepcopy(v))
                                     if isinstance(value, (list, dict)) else value)
        elif hasattr(ValueArchConfig, field_name):  # a class-level setting such as default_mixer_type
            namespace[field_name] = value
        else:
            raise ValueError(f"preset {preset.model_type!r} sets a default for {field_name!r}, which is neither a "
                             "ValueArchConfig field nor a class-level setting of it")
    return type(name, (ValueArchConfig,), namespace)


# model_type -> config class; the named ones are module-level names (BovConfig, ...) because a saved checkpoint's
# `auto_map` names them, e.g. "configuration_valuearch.BovConfig".
CONFIG_CLASSES: dict[str, type[ValueArchConfig]] = {
    model_type: preset_config_class(preset) if model_type != ValueArchConfig.model_type else ValueArchConfig
    for model_type, preset in PRESETS.items()
}
globals().update({config_class.__name__: config_class for config_class in CONFIG_CLASSES.values()})

__all__ = ["ValueArchConfig", "CONFIG_CLASSES",
           *(config_class.__name__ for config_class in CONFIG_CLASSES.values() if config_class is not ValueArchConfig)]
