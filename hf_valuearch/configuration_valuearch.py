"""Configuration of the hf_valuearch decoder: one Llama-style backbone, three orthogonal axes.

The backbone is a pre-norm decoder (RMSNorm, RoPE, SwiGLU, GQA, no biases). Three independent axes
choose what changes (see ``README.md`` / design):

1. value path (``value_source`` + mixing fields): where a layer's attention values come from;
2. depth routing (``depth_routing``): what each sublayer reads from depth;
3. sequence mixer (``mixer_types``, one entry per layer): what attention reads from the past.

Named architectures are subclasses below that only change defaults; each has its own ``model_type``.
Every invalid field raises ``ValueError`` naming the field, the value and what is allowed.
"""

from __future__ import annotations

from transformers.configuration_utils import PreTrainedConfig

# --- allowed values of each axis ------------------------------------------------------------------
VALUE_SOURCES = ("residual",)
DEPTH_ROUTINGS = ("standard", "block_attnres", "rd_attnres")
VALUE_ROUTES = ("learned", "tied", "average", "frozen")  # RD-AttnRes V-route query (depth_routing.py)
MIXER_TYPES = ("full_attention", "sliding_attention")
QK_NORMS = ("none", "rmsnorm", "layernorm")
MLP_ACTIVATIONS = ("swiglu", "relu2")


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
        mlp_activation: "swiglu" (Llama) or "relu2" (`down(relu(up(x))^2)`, nanochat / KVM backbone).
        final_logit_softcapping: if set to c, logits become `c * tanh(logits / c)` (nanochat: 15).
        rope_parameters["partial_rotary_factor"]: fraction of each head's dimensions that RoPE rotates
            (the first ones); the rest carry no position (KVM: 0.5).

    Axes:
        value_source: where attention values come from ("residual" = `h W_V`).
        depth_routing: how sublayers read depth: "standard" residual stream, "block_attnres" (Block
            Attention Residuals) or "rd_attnres" (Role-Decoupled AttnRes); see depth_routing.py.
        attnres_block_size: (block_attnres, rd_attnres) sublayers per block; an attention or MLP sublayer
            counts as one, so 1 is Full AttnRes.
        value_route: (rd_attnres) the V-route query: "learned", "tied", "average" or "frozen".
        mixer_types: per layer, "full_attention" or "sliding_attention" (window `sliding_window`).
    """

    model_type = "valuearch"
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
    mlp_activation: str = "swiglu"
    final_logit_softcapping: float | None = None
    # --- axis 1: value path ---
    value_source: str = "residual"
    # --- axis 2: depth routing ---
    depth_routing: str = "standard"
    attnres_block_size: int | None = None
    value_route: str | None = None
    # --- axis 3: sequence mixer ---
    mixer_types: list[str] | None = None
    sliding_window: int | None = None

    def __post_init__(self, **kwargs):
        if self.head_dim is None and isinstance(self.num_attention_heads, int) and self.num_attention_heads > 0:
            if isinstance(self.hidden_size, int) and self.hidden_size % self.num_attention_heads == 0:
                self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.mixer_types is None and isinstance(self.num_hidden_layers, int):
            self.mixer_types = ["full_attention"] * self.num_hidden_layers
        super().__post_init__(**kwargs)
        self.validate_valuearch()

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

        _check_choice("value_source", self.value_source, VALUE_SOURCES)
        _check_choice("depth_routing", self.depth_routing, DEPTH_ROUTINGS)
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
                  f"expected a list of {self.num_hidden_layers} entries (one per layer) from {list(MIXER_TYPES)}")
        self.mixer_types = list(self.mixer_types)
        for mixer in self.mixer_types:
            _check_choice("mixer_types", mixer, MIXER_TYPES)
        if "sliding_attention" in self.mixer_types:
            _check_int("sliding_window", self.sliding_window)
        elif self.sliding_window is not None:
            _fail("sliding_window", self.sliding_window, "must be None unless a layer is 'sliding_attention'")


# --- depth routing: Block AttnRes and RD-AttnRes -----------------------------------------------------


class AttnResConfig(ValueArchConfig):
    """Block Attention Residuals (Kimi Team, arXiv:2603.15031)."""

    model_type = "attnres"
    depth_routing: str = "block_attnres"
    # S = 4 sublayers: Table 4's Block AttnRes (S = 2, 4, 8 tie); N = 8 blocks for 16 layers ("N ≈ 8", §3.2).
    attnres_block_size: int | None = 4


class RdAttnResConfig(ValueArchConfig):
    """Role-Decoupled Attention Residuals (Wang, arXiv:2608.01075) over Block AttnRes."""

    model_type = "rd_attnres"
    depth_routing: str = "rd_attnres"
    # The RD-AttnRes abstract does not give the parent's block size; the Block AttnRes default (S = 4, Table 4).
    attnres_block_size: int | None = 4
    # "learning an independent value route" (RD-AttnRes abstract); the controls are the other values.
    value_route: str | None = "learned"


__all__ = ["ValueArchConfig", "AttnResConfig", "RdAttnResConfig"]
