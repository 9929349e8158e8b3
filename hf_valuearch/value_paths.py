"""Axis 1, value paths: where a layer's attention values come from and how they are mixed.

Sources of the extra values V~ (spec_value_paths.md; BoV = arXiv:2606.02780, ResFormer = arXiv:2410.17897,
SATFormer = arXiv:2605.03953, KVM = arXiv:2605.09877):

* "table": V~ = E_V[token_id], one |V| x kv_dim table per layer (BoV Eq. 4);
* "x0":    V~ = RMSNorm(e) W_V with the layer's own W_V (BoV Table 1, "x0 W_V");
* "v1":    V~ = V1, layer 0's raw values h_0 W_V^1 (ResFormer / SVFormer);
* "residual": V~ = V itself, the values of the residual stream (BoV Table 1 row 2, a learnable scale gamma * V).

Mixing rules, with V = h W_V the layer's own values:

* "substitute": V' = gamma * V~ (V is not computed; with V~ from a table or V1 the layer holds no W_V);
* "add":        V' = alpha * V + beta * V~ (ResFormer: alpha = lambda_2, beta = lambda_1);
* "relu_gate":  V' = V + ReLU(h W_alpha) * V1, one gate per token and KV head (SATFormer Eq. 3);
* "sigmoid_lerp": V' = V + σ(b + h W_down W_up) ⊙ (V1 - V), one gate per token and value channel (KVM-paper's
  RWKV-style value residual, `value_residual_mixin.py` mode "rwkv").

"Residual" always means the residual stream h here (the layer's normed input; its depth mixture under AttnRes):
value_source="residual", `residual_values` (V = h W_V) and `residual_scale` (alpha, V's coefficient) all name
values computed from it. ResFormer's "value residual" (its paper's name, Eq. 5: V_n' = lambda_1 V_1 +
lambda_2 V_n) is value_source="v1" with value_mix="add": lambda_1 = `source_scale` (beta, on V1) and lambda_2 =
`residual_scale` (alpha, on V_n); `value_coefficient_init` lists [lambda_2, lambda_1].

A layer's value path is called by `ValueArchAttention` as `value_path(value_input, v_proj, value_context)`
and, when a generation cache is given, `value_path.update_cache(...)` decides what is cached: table layers
cache the token ids instead of values and gather `gamma * E_V[ids]` for all positions at every step.

Diagnostics: every value-path module with parameters or gates has `diagnostics() -> dict` (coefficients, gate
statistics of the last forward), collected by `model.valuearch_diagnostics()`; `force_v1_gates(model, "zero" | "mean")` is the gate intervention of the SATFormer analysis.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init

from .functional import rms_norm


def token_x0(embeddings: torch.Tensor, eps: float) -> torch.Tensor:
    """x0 = RMSNorm(e), parameter-free, computed in float32 (BoV: `norm(x0)`). [..., D] -> same."""
    return rms_norm(embeddings, eps)


@dataclass
class ValueContext:
    """Per-forward inputs of the value paths; the model builds it, each decoder layer passes it to its value path
    (the layers take and return its tensors positionally, see `ValueArchDecoderLayer`).

    token_ids: [B, T] ids of the tokens of this forward (table layers).
    x0: [B, T, D] = RMSNorm(decoder input), computed once per forward when a layer reads it; the decoder input is
        the embeddings, after the backbone's embedding norm and smear where set (BoV's `norm(x0)`).
    v1: [B, T, H_kv, D_head], written by layer 0 when a later layer reads V1.
    """

    token_ids: torch.Tensor | None = None
    x0: torch.Tensor | None = None
    v1: torch.Tensor | None = None


def build_value_context(model, input_ids: torch.Tensor | None, decoder_inputs: torch.Tensor) -> ValueContext:
    """The context of one forward of `model` (a `ValueArchModel`; its value tables have a row per vocabulary entry,
    like the embeddings, so the model's check of `input_ids` covers them)."""
    config = model.config
    if config.value_source == "table" and input_ids is None:
        raise ValueError(
            f"value_source='table' (layers {config.value_layer_indices}) looks values up by token id: call the "
            "model with input_ids, not inputs_embeds alone."
        )
    x0 = token_x0(decoder_inputs, config.rms_norm_eps) if config.value_source == "x0" else None
    return ValueContext(token_ids=input_ids, x0=x0)


def projects_values(config, layer_idx: int) -> bool:
    """Whether layer `layer_idx` has its own W_V: all layers but those whose values are gamma * E_V[ids] or
    gamma * V1 alone (BoV skips c_v at its target layers; a W_V there would never get a gradient, which
    DistributedDataParallel without `find_unused_parameters` refuses)."""
    return not (layer_idx in config.value_layer_indices and config.value_mix == "substitute"
                and config.value_source in ("table", "v1"))


def caches_token_ids(config, layer_idx: int) -> bool:
    """Whether layer `layer_idx` keeps keys and token ids, but no values, in the generation cache."""
    return (config.value_source == "table" and config.value_mix == "substitute"
            and layer_idx in config.value_layer_indices)


class StandardValues(nn.Module):
    """Standard attention values, V = h W_V (Vaswani et al., 2017)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.head_dim = config.head_dim

    def residual_values(self, value_input: torch.Tensor, v_proj: nn.Module) -> torch.Tensor:
        """V = h W_V: [B, T, D] -> [B, T, H_kv, D_head]."""
        return v_proj(value_input).view(*value_input.shape[:-1], -1, self.head_dim)

    def forward(self, value_input: torch.Tensor, v_proj: nn.Module, value_context: ValueContext | None = None):
        return self.residual_values(value_input, v_proj)

    def update_cache(self, cache, layer_idx: int, key_states, value_states, value_context):
        """Write this step's keys and values ([B, H_kv, T, D_head]); return those of all cached positions."""
        return cache.update(key_states, value_states, layer_idx)


class FirstLayerValues(StandardValues):
    """Layer 0 when later layers read V1: standard values, also handed on as V1 = h_0 W_V^1 (before any mixing)."""

    def forward(self, value_input, v_proj, value_context=None):
        values = self.residual_values(value_input, v_proj)
        value_context.v1 = values
        return values


class MixedValues(StandardValues):
    """V' = gamma * V~ ("substitute") or alpha * V + beta * V~ ("add"), V~ from `config.value_source`.

    Coefficients are unbounded scalars, learnable (`nn.Parameter`: value_scale = gamma, residual_scale = alpha,
    source_scale = beta) or fixed floats; their initial values come from `config.value_coefficient_values`
    (BoV: gamma = 1; BoV `learn_init_coeffs`: alpha = 1, beta = 0; ResFormer identity: 0.5 / 0.5).
    """

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.source = config.value_source
        self.mix = config.value_mix
        self.learnable = config.value_coefficients == "learnable"
        self.coefficient_init = config.value_coefficient_values
        names = ("value_scale",) if self.mix == "substitute" else ("residual_scale", "source_scale")
        for name, value in zip(names, self.coefficient_init):
            if self.learnable:
                setattr(self, name, nn.Parameter(torch.tensor(float(value))))
            else:
                setattr(self, name, float(value))
        self.coefficient_names = names
        if self.source == "table":
            kv_dim = config.num_key_value_heads * config.head_dim
            self.value_table = nn.Embedding(config.vocab_size, kv_dim)  # E_V: [|V|, H_kv * D_head]

    def init_valuearch_weights(self, init):
        """Coefficients to their configured initial values (called from `_init_weights`)."""
        if self.learnable:
            for name, value in zip(self.coefficient_names, self.coefficient_init):
                init.constant_(getattr(self, name), value)

    def table_values(self, token_ids: torch.Tensor) -> torch.Tensor:
        """E_V[ids]: [B, T] -> [B, T, H_kv, D_head], gathered on the table's device; only these rows move."""
        table_device = self.value_table.weight.device
        rows = self.value_table(token_ids.to(table_device))
        return rows.to(token_ids.device).view(*token_ids.shape, -1, self.head_dim)

    def source_values(self, value_input, v_proj, value_context, residual_values):
        """V~: [B, T, H_kv, D_head]."""
        if self.source == "table":
            return self.table_values(value_context.token_ids)
        if self.source == "x0":
            return self.residual_values(value_context.x0, v_proj)
        if self.source == "v1":
            return value_context.v1
        return residual_values

    def mixed(self, residual_values, source_values):
        if self.mix == "substitute":
            return self.value_scale * source_values
        return self.residual_scale * residual_values + self.source_scale * source_values

    def forward(self, value_input, v_proj, value_context=None):
        reads_residual = self.mix == "add" or self.source == "residual"
        residual_values = self.residual_values(value_input, v_proj) if reads_residual else None
        source_values = self.source_values(value_input, v_proj, value_context, residual_values)
        return self.mixed(residual_values, source_values.to(value_input.dtype))

    def update_cache(self, cache, layer_idx, key_states, value_states, value_context):
        if not (self.source == "table" and self.mix == "substitute"):
            return cache.update(key_states, value_states, layer_idx)
        # Keys as usual; the value slot holds the token ids [B, 1, T, 1] (see cache_valuearch.KeysAndTokenIdsLayer)
        key_states, token_ids = cache.update(key_states, value_context.token_ids[:, None, :, None], layer_idx)
        values = self.mixed(None, self.table_values(token_ids[:, 0, :, 0]).to(key_states.dtype))
        return key_states, values.transpose(1, 2)

    def diagnostics(self) -> dict:
        """The coefficients of this layer: {"value_scale": gamma} or {"residual_scale": alpha, "source_scale": beta}."""
        return {name: float(torch.as_tensor(getattr(self, name)).detach()) for name in self.coefficient_names}


class GatedV1Values(StandardValues):
    """SATFormer: V' = V + ReLU(h W_alpha) * V1 (arXiv:2605.03953 Eq. 3), alpha: [B, T, H_kv].

    `v1_gate` is W_alpha = Linear(hidden, H_kv, bias=False), initialised N(0, initializer_range) like every
    linear layer (SATFormer `_init_weights`); h is the normed block input (the input of W_V).
    Each forward records the gate mean and the fraction of exactly-zero gates per KV head (`diagnostics()`).
    `gate_override` ([H_kv] or None) replaces the gate by a constant per head (`force_v1_gates`).
    """

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.v1_gate = nn.Linear(config.hidden_size, config.num_key_value_heads, bias=False)
        self.gate_override: torch.Tensor | None = None
        self.last_gate_mean: torch.Tensor | None = None
        self.last_gate_zero_fraction: torch.Tensor | None = None

    def forward(self, value_input, v_proj, value_context=None):
        values = self.residual_values(value_input, v_proj)
        # ReLU written as clamp: the same values, but a gradient of 1 at exactly 0 (clamp's convention, where
        # F.relu's is 0), so all-zero gate weights (a converted model) still receive gradient and can open.
        gate = self.v1_gate(value_input).clamp(min=0)  # [B, T, H_kv]
        with torch.no_grad():
            self.last_gate_mean = gate.detach().float().mean(dim=(0, 1))
            self.last_gate_zero_fraction = (gate.detach() == 0).float().mean(dim=(0, 1))
        if self.gate_override is not None:
            gate = self.gate_override.to(gate).expand_as(gate)
        return values + gate.unsqueeze(-1) * value_context.v1.to(values.dtype)

    def diagnostics(self) -> dict:
        """Per KV head, over the tokens of the most recent forward: mean gate and fraction of gates exactly 0."""
        if self.last_gate_mean is None:
            return {}
        return {"v1_gate_mean": self.last_gate_mean.cpu().tolist(),
                "v1_gate_zero_fraction": self.last_gate_zero_fraction.cpu().tolist()}


class SigmoidLerpV1Values(StandardValues):
    """KVM-paper's value residual: V' = V + σ(b + h W_down W_up) ⊙ (V1 - V), a per-token, per-channel
    interpolation between the layer's values and V1 (recursal/KVM-paper `value_residual_mixin.py`, mode "rwkv";
    h is the normed block input, the input of W_V).

    `v1_gate_bias` is b [H_kv * D_head], `v1_gate_down` W_down = Linear(hidden, value_gate_rank) and `v1_gate_up`
    W_up = Linear(value_gate_rank, H_kv * D_head), both without bias. Initialised as the paper's: b = 0.73 -
    0.4 * linspace(-0.5, 0.5) over the channels, W_down = 0 (so the gate starts at σ(b)), W_up N(0,
    initializer_range).
    """

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        kv_dim = config.num_key_value_heads * config.head_dim
        self.v1_gate_bias = nn.Parameter(torch.zeros(kv_dim))
        self.v1_gate_down = nn.Linear(config.hidden_size, config.value_gate_rank, bias=False)
        self.v1_gate_up = nn.Linear(config.value_gate_rank, kv_dim, bias=False)

    def init_valuearch_weights(self, init):
        channels = self.v1_gate_bias.shape[0]
        init.copy_(self.v1_gate_bias, 0.73 - 0.4 * torch.linspace(-0.5, 0.5, channels))
        init.zeros_(self.v1_gate_down.weight)

    def forward(self, value_input, v_proj, value_context=None):
        values = self.residual_values(value_input, v_proj)  # [B, T, H_kv, D_head]
        gate = torch.sigmoid(self.v1_gate_bias + self.v1_gate_up(self.v1_gate_down(value_input)))  # [B, T, kv_dim]
        return values + (value_context.v1.to(values.dtype) - values) * gate.view_as(values).to(values.dtype)


def build_value_path(config, layer_idx: int) -> nn.Module:
    """The value path of decoder layer `layer_idx`."""
    if layer_idx in config.value_layer_indices:
        gated = {"relu_gate": GatedV1Values, "sigmoid_lerp": SigmoidLerpV1Values}
        return gated.get(config.value_mix, MixedValues)(config, layer_idx)
    if layer_idx == 0 and config.value_source == "v1":
        return FirstLayerValues(config, layer_idx)
    return StandardValues(config, layer_idx)


def value_table_paths(model) -> dict[int, MixedValues]:
    """{layer index: value path} of the table layers of `model` (a `ValueArchModel`)."""
    return {i: layer.self_attn.value_path for i, layer in enumerate(model.layers)
            if isinstance(layer.self_attn.value_path, MixedValues) and layer.self_attn.value_path.source == "table"}


def align_value_tables(model, value_projections: dict[int, nn.Linear] | None = None,
                       layers: list[int] | None = None) -> None:
    """BoV aligned init: E_V[t] = W_V RMSNorm(e[t]) (BoV `init_weights`), for the table layers `layers` (default:
    all) of `model`, a `ValueArchModel`; tables already loaded from a checkpoint are left as they are.

    W_V is `value_projections[layer]` when given (a converted model's v_proj), else a fresh draw
    N(0, initializer_range): the W_V the layer would start with had it one (table layers hold none, as
    BoV's target layers use none), so step 0 is an x0 W_V-substitutive model.
    """
    value_projections = value_projections or {}
    with torch.no_grad():
        x0_table = token_x0(model.embed_tokens.weight, model.config.rms_norm_eps)  # [|V|, D]
        for layer_idx, value_path in value_table_paths(model).items():
            if layers is not None and layer_idx not in layers:
                continue
            table = value_path.value_table.weight  # [|V|, kv_dim]
            projection = value_projections.get(layer_idx)
            if projection is None:
                projection = nn.Linear(x0_table.shape[1], table.shape[1], bias=False, device=table.device,
                                       dtype=table.dtype)
                projection.weight.normal_(0.0, model.config.initializer_range)
            init.copy_(table, projection(x0_table.to(projection.weight)).to(table))


def resize_value_tables(model, num_rows: int) -> None:
    """Give every value table of `model` (a `ValueArchModel`) `num_rows` rows, after its embeddings were resized.

    Kept rows are unchanged; new rows are aligned from the new embeddings, E_V[t] = W_V RMSNorm(e[t]), with W_V
    the least-squares fit of the layer's table on the old rows (the exact W_V of an untrained aligned table).
    """
    x0_table = token_x0(model.embed_tokens.weight.detach(), model.config.rms_norm_eps).double()  # [|V'|, D]
    for value_path in value_table_paths(model).values():
        table = value_path.value_table  # resized in place, as transformers resizes the embeddings
        old_rows = table.weight.detach()  # [|V|, kv_dim]
        kept = min(table.num_embeddings, num_rows)
        rows = old_rows.new_empty(num_rows, table.embedding_dim)
        rows[:kept] = old_rows[:kept]
        if num_rows > kept:
            fit = torch.linalg.lstsq(x0_table[:kept].to(old_rows.device), old_rows.double()).solution  # W_V^T [D, kv]
            rows[kept:] = (x0_table[kept:].to(old_rows.device) @ fit).to(rows)
        table.weight.data = rows
        table.num_embeddings = num_rows


def place_value_tables(model, device) -> None:
    """Move every value table to `device` (e.g. "cpu" for host offload of a GPU model).

    Afterwards each table layer gathers only the rows of the current tokens on the table's device and moves
    those [B, T, kv_dim] rows to the compute device. Calling `model.to(...)` moves the tables back.
    """
    for module in model.modules():
        if isinstance(module, MixedValues) and module.source == "table":
            module.value_table.to(device)


@contextlib.contextmanager
def force_v1_gates(model, mode: str):
    """Force every SATFormer gate alpha = ReLU(h W_alpha) to a constant while the context is open.

    mode "zero": alpha = 0 (V' = V, the layer ignores V1); "mean": alpha = the per-KV-head mean gate recorded by
    the most recent forward before entering (SATFormer's analysis of gate selectivity). The gate statistics
    keep recording the unforced gates.
    """
    if mode not in ("zero", "mean"):
        raise ValueError(f"force_v1_gates mode={mode!r} is invalid: allowed values are ['zero', 'mean'].")
    gates = [m for m in model.modules() if isinstance(m, GatedV1Values)]
    if not gates:
        raise ValueError("force_v1_gates needs a model with SATFormer gates (value_mix='relu_gate').")
    if mode == "mean" and any(m.last_gate_mean is None for m in gates):
        raise ValueError("force_v1_gates(mode='mean') needs a forward pass first, to record the mean gates.")
    for module in gates:
        module.gate_override = (torch.zeros_like(module.v1_gate.weight[:, 0]) if mode == "zero"
                                else module.last_gate_mean.clone())
    try:
        yield model
    finally:
        for module in gates:
            module.gate_override = None
