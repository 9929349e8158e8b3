"""Axis 2, depth routing: what each sublayer reads from the layers below it.

Every decoder layer holds one `layer router`; the depth state flows through the layers as a pair
`(hidden_states, depth_state)`. `hidden_states` [B, T, D] is always the residual-equivalent stream
(what `output_hidden_states` reports); `depth_state` is a flat tuple of the other [B, T, D] tensors the
routing carries (empty for the standard residual). It is flat so that the decoder layer can take and
return its tensors positionally, which is what reentrant gradient checkpointing tracks. Reads return the sublayer's *normed* input: the router receives the layer's pre-norm
so that it can fuse it into its read. A decoder layer calls, in order:

    attn_input, value_input = router.read_attention(hidden_states, depth_state, input_layernorm)
    hidden_states, depth_state = router.write_attention(hidden_states, depth_state, attention_output)
    mlp_input = router.read_mlp(hidden_states, depth_state, post_attention_layernorm)
    hidden_states, depth_state = router.write_mlp(hidden_states, depth_state, mlp_output)

(value_input None: the values are projected from attn_input), and the model calls
`readout.start(embeddings) -> (hidden_states, depth_state)` before the first layer and
`readout.finish(hidden_states, depth_state, final_norm)` for the final normed hidden states.

Routings (config.depth_routing):

* "standard": the pre-norm residual stream, h_{l+1} = h_l + f_l(Norm(h_l)).
* "block_attnres": Block Attention Residuals (Kimi Team, arXiv:2603.15031, §3.2, Eq. 5-6). The sources
  are the embedding b_0, the disjoint sums b_1..b_{n-1} of the sublayer outputs of each completed block
  and the partial sum of the current block; every sublayer reads a softmax over depth
  h = Σ_j α_j v_j, α = softmax_j(w · RMSNorm(v_j)) (Eq. 2-3; fp32 softmax, no 1/sqrt(d)), with its own
  zero-initialised pseudo-query w and key RMSNorm. `depth_read_reference` computes it as written (by autograd);
  `depth_read`, the default, fuses it with the sublayer's pre-norm and a hand-written backward; the tests compare
  the two and `use_reference_depth_read(model)` switches a model to the reference. Blocks are
  `config.attnres_block_size` sublayers long (an attention or MLP sublayer counts as one), scheduled as in
  Megatron-LM's `attention_residual.py`: the depth state (*sources, partial) starts as (embedding,), the partial
  sum alone; a sublayer that starts a block appends the partial sum to the sources and starts a new partial sum
  with its output. A final read before the final norm aggregates all sources.
* "rd_attnres": Role-Decoupled AttnRes (Wang, arXiv:2608.01075): the attention-side read splits into a
  Q/K route and a V route over the same sources and key norm; Q and K are projected from the Q/K-route
  mixture, V from the V-route mixture. The MLP-side and final reads are unchanged. `config.value_route`
  selects the V-route query (these control definitions are reconstructed from the paper's abstract,
  which names the controls but does not define them; see spec_attnres.md §4):
    - "learned": its own zero-initialised query `value_route_query`;
    - "tied": the V route is the Q/K route (both executed; equals Block AttnRes exactly);
    - "average": both routes run with their own queries and the mean of their mixtures, ½(h_QK + h_V),
      feeds Q, K and V (controls for running the routing twice; spec_attnres.md §4);
    - "frozen": a fixed zero query, i.e. a uniform mean over the sources (a fixed value route).
"""

from __future__ import annotations

import torch
from torch import nn

from .functional import rms_norm

ATTNRES_ROUTINGS = ("block_attnres", "rd_attnres")


# --- the depth softmax ---------------------------------------------------------------------------------


class _DepthSoftmaxMixNorm(torch.autograd.Function):
    """k depth reads over the same sources in one pass (AttnRes Eq. 2-3, key-norm weight folded into q),
    each followed by the reading sublayer's pre-norm RMSNorm (weight w, epsilon norm_eps):

        rstd_j = rsqrt(mean(v_j^2) + eps),  dots_jq = v_j · q_q,  α_jq = softmax_j(dots_jq · rstd_j),
        m_q = Σ_j β_jq v_j,  r_q = rsqrt(mean(m_q^2) + norm_eps),  out_q = w ⊙ (m_q r_q)

    with mixing weights β = α (k outputs), or, with `average_mixtures`, one output mixed with the mean
    β_j = (1/k) Σ_q α_jq, i.e. the mean of the k mixtures (RD-AttnRes's "average" control).

    in float32 (float64 for float64 values), cast back to the values' dtype before the weight, as
    `ValueArchRMSNorm` does. Backward keeps references to the values, the per-token α, dots, rstd
    [n, B, T, k] and r [k, B, T, 1], and the normalised mixtures m r [k, B, T, D] in the values' dtype (what a
    separate RMSNorm would save as its input); it recomputes the rest as Megatron-LM's
    `_AttnResAggregation` does, so no per-source float32 copy lives until the backward pass. The k
    mixtures share each pass over the sources. Fusing the
    pre-norm saves autograd's many small RMSNorm backward ops, which matters most for RD-AttnRes's
    second (value-route) read. Returns the outputs as separate tensors and α [n, B, T, k] (not
    differentiable).
    """

    @staticmethod
    def forward(ctx, queries, eps: float, norm_weight, norm_eps: float, average_mixtures: bool, *values):
        # queries: [k, D] in the compute dtype; norm_weight: [D]; values: n tensors [B, T, D]
        hidden_size, dtype, out_dtype = values[0].shape[-1], queries.dtype, values[0].dtype
        dots = torch.stack([v.to(dtype) @ queries.T for v in values])  # [n, B, T, k]
        mean_squares = torch.stack(
            [torch.linalg.vector_norm(v, dim=-1, dtype=dtype).square() for v in values]
        ) / hidden_size  # [n, B, T]
        rstd = torch.rsqrt(mean_squares + eps).unsqueeze(-1)  # [n, B, T, 1]
        alpha = torch.softmax(dots * rstd, dim=0)  # [n, B, T, k]
        weights = alpha.mean(-1, keepdim=True) if average_mixtures else alpha  # β [n, B, T, k_out]
        # all mixtures in one pass over the sources: m [k_out, B, T, D]
        weights_by_output = weights.permute(0, 3, 1, 2).unsqueeze(-1)  # [n, k_out, B, T, 1]
        mixed = weights_by_output[0] * values[0]
        for weight_j, v in zip(weights_by_output[1:], values[1:]):
            mixed.addcmul_(weight_j, v)
        mixed_mean_square = torch.linalg.vector_norm(mixed, dim=-1, keepdim=True).square() / hidden_size
        mixed_rstd = torch.rsqrt(mixed_mean_square + norm_eps)  # r [k, B, T, 1]
        normalised = mixed.mul_(mixed_rstd).to(out_dtype)  # m r  [k, B, T, D]
        outputs = [norm_weight * normalised_q for normalised_q in normalised]
        ctx.save_for_backward(queries, norm_weight, alpha, dots, rstd, mixed_rstd, normalised, *values)
        ctx.average_mixtures = average_mixtures
        ctx.mark_non_differentiable(alpha)
        return (*outputs, alpha)

    @staticmethod
    def backward(ctx, *grads):
        queries, norm_weight, alpha, dots, rstd, mixed_rstd, normalised, *values = ctx.saved_tensors
        hidden_size, dtype = values[0].shape[-1], queries.dtype
        # through the RMSNorm, n = m r, dn = g ⊙ w: dm = r (dn - n mean(dn ⊙ n)), dw = Σ g ⊙ n
        weight = norm_weight.to(dtype)
        grad_norm_weight = torch.zeros_like(weight)
        grad_mixed = torch.empty(normalised.shape, dtype=dtype, device=normalised.device)  # dm [k, B, T, D]
        for q, grad_q in enumerate(grads[:-1]):  # grads[-1] is α's
            grad_q, normalised_q = grad_q.to(dtype), normalised[q].to(dtype)
            grad_times_normalised = grad_q * normalised_q  # [B, T, D]
            grad_norm_weight += grad_times_normalised.flatten(0, -2).sum(0)
            projection = (grad_times_normalised @ weight).unsqueeze(-1) / hidden_size  # mean(dn ⊙ n_q) [B, T, 1]
            torch.mul(grad_q, weight, out=grad_mixed[q])
            grad_mixed[q].addcmul_(normalised_q, projection, value=-1).mul_(mixed_rstd[q])
        # through the mixing weights: u_jo = <dm_o, v_j> = dL/dβ_jo; dL/dα_jq = u_jq, or u_j / k for the mean
        products = torch.empty_like(grad_mixed)  # dm_o ⊙ v_j, one buffer for every source
        u = torch.stack([torch.mul(grad_mixed, v, out=products).sum(-1) for v in values]).permute(0, 2, 3, 1)
        weights = alpha.mean(-1, keepdim=True) if ctx.average_mixtures else alpha  # β [n, B, T, k_out]
        grad_alpha = u / alpha.shape[-1] if ctx.average_mixtures else u  # [n, B, T, k] (broadcast)
        # through the depth softmax: d logit_jq = α_jq (g_jq - Σ_i α_iq g_iq)
        grad_logits = alpha * (grad_alpha - (alpha * grad_alpha).sum(0, keepdim=True))  # [n, B, T, k]
        grad_dots = grad_logits * rstd  # d/d dots_jq  [n, B, T, k]
        # d logit / d rstd · d rstd / d v_j = -(Σ_q dlogit_jq dots_jq) rstd_j^3 v_j / D
        norm_coefficient = -(grad_logits * dots).sum(-1, keepdim=True) * rstd.pow(3) / hidden_size  # [n, B, T, 1]
        grad_values = []
        for weight_j, grad_dots_j, coefficient_j, v in zip(weights, grad_dots, norm_coefficient, values):
            grad_v = (grad_dots_j @ queries).addcmul_(coefficient_j, v)  # [B, T, D]
            for o in range(len(grad_mixed)):
                grad_v.addcmul_(weight_j[..., o : o + 1], grad_mixed[o])  # + β_jo dm_o
            grad_values.append(grad_v.to(v.dtype))
        grad_queries = None
        if ctx.needs_input_grad[0]:
            grad_queries = sum(
                grad_dots_j.flatten(0, 1).T @ v.to(dtype).flatten(0, 1) for grad_dots_j, v in zip(grad_dots, values)
            )  # [k, D]
        return grad_queries, None, grad_norm_weight.to(norm_weight.dtype), None, None, *grad_values


def depth_read(values: list[torch.Tensor], queries: torch.Tensor, key_norm: nn.Module, norm: nn.Module,
               average_mixtures: bool = False):
    """Read `values` (n tensors [B, T, D]) over depth once per pseudo-query ([k, D]) with the key RMSNorm
    `key_norm` (its `weight` and `eps`), and apply the reading sublayer's RMSNorm `norm` (its `weight`, or
    none, and `variance_epsilon`) to each mixture, or, with `average_mixtures`, to the mean of the k mixtures.

    The key-norm weight folds into the queries, w · (γ ⊙ RMSNorm(v)) = (w ⊙ γ) · RMSNorm(v), in float32 (float64
    for float64 values) whatever the parameters' dtype, as Megatron-LM does (its `mark_keep_in_fp32`).
    Returns the normalised mixtures (a list of k, or 1, [B, T, D] in the values' dtype) and the depth weights
    α [n, B, T, k] (float32 or float64, detached).
    """
    if torch.compiler.is_compiling():  # the compiler fuses the formula itself (and dynamo cannot trace the Function)
        return depth_read_reference(values, queries, key_norm, norm, average_mixtures)
    # the values' device: with a device map, the final read's module may sit elsewhere than the last layer
    device, compute_dtype = values[0].device, torch.promote_types(values[0].dtype, torch.float32)
    folded = queries.to(device, compute_dtype) * key_norm.weight.to(device, compute_dtype)  # [k, D]
    norm_weight = norm.weight.to(device) if norm.weight is not None else values[0].new_ones(values[0].shape[-1])
    *outputs, alpha = _DepthSoftmaxMixNorm.apply(
        folded, key_norm.eps, norm_weight, norm.variance_epsilon, average_mixtures, *values
    )
    return outputs, alpha


def depth_read_reference(values: list[torch.Tensor], queries: torch.Tensor, key_norm: nn.Module, norm: nn.Module,
                         average_mixtures: bool = False):
    """`depth_read` as the paper writes it, differentiated by autograd: the reference the fused read is tested
    against (`use_reference_depth_read` switches a model to it), and what torch.compile / torch.export trace.
    Same arguments, results and precision.

    For pseudo-query w and sources v_j (AttnRes Eq. 2-3; no 1/sqrt(d) scaling):
        α_j = softmax_j(w · RMSNorm(v_j))   (Eq. 2, the key RMSNorm with its weight γ)
        h = Σ_j α_j v_j                       (Eq. 3)
    then the reading sublayer's pre-norm, out = norm(h).
    """
    device, compute_dtype = values[0].device, torch.promote_types(values[0].dtype, torch.float32)
    sources = torch.stack([v.to(compute_dtype) for v in values])  # v_j: [n, B, T, D]
    keys = rms_norm(sources, key_norm.eps, compute_dtype) * key_norm.weight.to(device, compute_dtype)  # [n, B, T, D]
    alpha = torch.softmax(keys @ queries.to(device, compute_dtype).T, dim=0)  # Eq. 2: [n, B, T, k]
    weights = alpha.mean(-1, keepdim=True) if average_mixtures else alpha  # the mean of the k mixtures, or each
    mixtures = torch.einsum("nbtk,nbtd->kbtd", weights, sources)  # Eq. 3: h [k, B, T, D]
    normalised = rms_norm(mixtures, norm.variance_epsilon, compute_dtype).to(values[0].dtype)
    outputs = [h if norm.weight is None else norm.weight.to(device) * h for h in normalised]
    return outputs, alpha.detach()


# --- standard residual ---------------------------------------------------------------------------------


class StandardResidual(nn.Module):
    """The pre-norm residual stream: h_{l+1} = h_l + f_l(Norm(h_l)); no depth state."""

    def read_attention(self, hidden_states: torch.Tensor, depth_state: tuple[()], norm: nn.Module):
        return norm(hidden_states), None

    def read_mlp(self, hidden_states: torch.Tensor, depth_state: tuple[()], norm: nn.Module) -> torch.Tensor:
        return norm(hidden_states)

    def write_attention(self, hidden_states: torch.Tensor, depth_state: tuple[()], output: torch.Tensor):
        return hidden_states + output, ()

    write_mlp = write_attention


class StandardReadout(nn.Module):
    """Model-level ends of the standard residual stream: it starts as the embeddings and is read as is."""

    def start(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, tuple[()]]:
        return embeddings, ()

    def finish(self, hidden_states: torch.Tensor, depth_state: tuple[()], norm: nn.Module) -> torch.Tensor:
        return norm(hidden_states)


# --- Block AttnRes / RD-AttnRes ------------------------------------------------------------------------


class DepthKeyRMSNorm(nn.Module):
    """The key RMSNorm of one depth read (its learnable weight, init ones, folds into the query:
    w · (γ ⊙ RMSNorm(v)) = (w ⊙ γ) · RMSNorm(v))."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class _DepthReading:
    """Which depth read a router uses: the fused `depth_read`, or the paper's `depth_read_reference` once
    `use_reference_depth_read(model)` set `reference_read`."""

    reference_read = False

    def _depth_read(self, *args, **kwargs):
        return (depth_read_reference if self.reference_read else depth_read)(*args, **kwargs)


class _DepthRecording:
    """Opt-in record of the last forward's depth weights (detached, per token) for `diagnostics()`."""

    record_routes = False

    def _record(self, name: str, alpha: torch.Tensor):
        if self.record_routes:
            self.recorded_routes[name] = alpha.detach()  # [n, B, T]

    def route_diagnostics(self, token_mask: torch.Tensor | None = None) -> dict:
        """Mean depth distribution of every recorded read (over tokens where `token_mask` [B, T] is true)."""
        return {name: mean_over_tokens(alpha, token_mask).tolist() for name, alpha in self.recorded_routes.items()}


def mean_over_tokens(per_token: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Average [..., B, T] over its last two dims, only where `token_mask` [B, T] is true; returns float32 on CPU."""
    per_token = per_token.float()
    if token_mask is None:
        return per_token.mean((-2, -1)).cpu()
    weights = token_mask.to(per_token.device, torch.float32)
    return ((per_token * weights).sum((-2, -1)) / weights.sum()).cpu()


def jensen_shannon(p: torch.Tensor, q: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """JS(p, q) = ½ KL(p‖m) + ½ KL(q‖m), m = ½(p + q), in nats, over `dim` (RD-AttnRes diagnostic)."""
    m = 0.5 * (p + q)
    return 0.5 * (torch.xlogy(p, p) - torch.xlogy(p, m) + torch.xlogy(q, q) - torch.xlogy(q, m)).sum(dim)


class BlockAttnResRouter(_DepthReading, _DepthRecording, nn.Module):
    """Depth router of one decoder layer for Block AttnRes and RD-AttnRes (see the module docstring).

    depth_state = (*sources, partial): the sources [B, T, D] (embedding, then completed block sums), then
    partial [B, T, D], the sum of the current block's sublayer outputs so far. hidden_states is carried
    alongside as Σ sources + partial, the standard residual stream these sources partition.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        hidden_size, eps = config.hidden_size, config.rms_norm_eps
        block_size = config.attnres_block_size
        # Sublayer 2l is layer l's attention, 2l + 1 its MLP; a block starts every `block_size` sublayers.
        self.attention_starts_block = (2 * layer_idx) % block_size == 0
        self.mlp_starts_block = (2 * layer_idx + 1) % block_size == 0
        self.attn_route_query = nn.Parameter(torch.zeros(hidden_size))  # w_l, zero-init (paper §3.1)
        self.attn_route_key_norm = DepthKeyRMSNorm(hidden_size, eps)
        self.mlp_route_query = nn.Parameter(torch.zeros(hidden_size))
        self.mlp_route_key_norm = DepthKeyRMSNorm(hidden_size, eps)
        self.value_route = config.value_route if config.depth_routing == "rd_attnres" else None
        if self.value_route in ("learned", "average"):
            self.value_route_query = nn.Parameter(torch.zeros(hidden_size))  # zero-init [unverified]
        self.recorded_routes: dict[str, torch.Tensor] = {}

    def init_valuearch_weights(self, init):
        """Pseudo-queries start at zero: uniform depth weights, the PreNorm model up to ε (paper §3.1)."""
        init.zeros_(self.attn_route_query)
        init.zeros_(self.mlp_route_query)
        if hasattr(self, "value_route_query"):
            init.zeros_(self.value_route_query)

    def _attention_queries(self) -> torch.Tensor:
        """[1, D] (Block AttnRes) or [2, D] (Q/K route, V route) pseudo-queries."""
        qk_query = self.attn_route_query
        if self.value_route is None:
            return qk_query.unsqueeze(0)
        if self.value_route in ("learned", "average"):
            value_query = self.value_route_query
        elif self.value_route == "tied":
            value_query = qk_query
        else:  # "frozen": uniform mean over the sources
            value_query = torch.zeros_like(qk_query)
        return torch.stack([qk_query, value_query])

    def read_attention(self, hidden_states, depth_state, norm):
        # Every read sees sources + partial: at a block start that is Eq. 6's [b_0, ..., b_{n-1}] (the
        # partial is the completed block, which the following write turns into a source).
        average = self.value_route == "average"  # ½(h_QK + h_V) feeds Q, K and V
        mixed, alpha = self._depth_read(list(depth_state), self._attention_queries(), self.attn_route_key_norm, norm,
                                        average_mixtures=average)
        self._record("attention_qk", alpha[..., 0])
        if self.value_route is None:
            return mixed[0], None
        self._record("attention_value", alpha[..., 1])
        return mixed[0], None if average else mixed[1]

    def read_mlp(self, hidden_states, depth_state, norm):
        mixed, alpha = self._depth_read(list(depth_state), self.mlp_route_query.unsqueeze(0), self.mlp_route_key_norm,
                                        norm)
        self._record("mlp", alpha[..., 0])
        return mixed[0]

    @staticmethod
    def _write(hidden_states, depth_state, output, starts_block: bool):
        *sources, partial = depth_state
        if starts_block:  # the completed block sum (the embedding, at sublayer 0) becomes a source
            return hidden_states + output, (*sources, partial, output)
        return hidden_states + output, (*sources, partial + output)

    def write_attention(self, hidden_states, depth_state, output):
        return self._write(hidden_states, depth_state, output, self.attention_starts_block)

    def write_mlp(self, hidden_states, depth_state, output):
        return self._write(hidden_states, depth_state, output, self.mlp_starts_block)

    def diagnostics(self, token_mask: torch.Tensor | None = None) -> dict:
        """Last recorded forward: mean depth distributions of the attention Q/K route ("attention_qk"),
        the V route ("attention_value", RD-AttnRes) and the MLP read ("mlp"), lists over sources
        (embedding first); "qk_value_js": per-token Jensen-Shannon divergence between the Q/K and V
        routes averaged over tokens (RD-AttnRes); and the norms of the pseudo-queries."""
        report = self.route_diagnostics(token_mask)
        if "attention_value" in self.recorded_routes:
            js = jensen_shannon(self.recorded_routes["attention_qk"], self.recorded_routes["attention_value"])
            report["qk_value_js"] = float(mean_over_tokens(js, token_mask))
        for name, parameter in self.named_parameters():
            if name.endswith("route_query"):
                report[f"{name}_norm"] = float(parameter.detach().float().norm())
        return report


class BlockAttnResReadout(_DepthReading, _DepthRecording, nn.Module):
    """Model-level ends of (RD-)AttnRes: the state starts as (embedding,) (no source yet, the embedding as the
    partial sum); the final read aggregates all sources with its own pseudo-query before the final norm
    (paper §3.2)."""

    def __init__(self, config):
        super().__init__()
        self.final_route_query = nn.Parameter(torch.zeros(config.hidden_size))
        self.final_route_key_norm = DepthKeyRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.recorded_routes: dict[str, torch.Tensor] = {}

    def init_valuearch_weights(self, init):
        """The final pseudo-query starts at zero (`init`: transformers.initialization, skips loaded weights)."""
        init.zeros_(self.final_route_query)

    def start(self, embeddings: torch.Tensor):
        return embeddings, (embeddings,)

    def finish(self, hidden_states, depth_state, norm) -> torch.Tensor:
        query = self.final_route_query.unsqueeze(0)
        mixed, alpha = self._depth_read(list(depth_state), query, self.final_route_key_norm, norm)
        self._record("final", alpha[..., 0])
        return mixed[0]

    def diagnostics(self, token_mask: torch.Tensor | None = None) -> dict:
        """Last recorded forward: mean depth distribution of the final read ("final"), query norm."""
        report = self.route_diagnostics(token_mask)
        report["final_route_query_norm"] = float(self.final_route_query.detach().float().norm())
        return report


# --- construction and diagnostics over a model ---------------------------------------------------------


def build_layer_router(config, layer_idx: int) -> nn.Module:
    """The depth router of decoder layer `layer_idx`."""
    if config.depth_routing in ATTNRES_ROUTINGS:
        return BlockAttnResRouter(config, layer_idx)
    return StandardResidual()


def build_readout(config) -> nn.Module:
    """The model-level start and final read of the depth routing."""
    if config.depth_routing in ATTNRES_ROUTINGS:
        return BlockAttnResReadout(config)
    return StandardReadout()


def record_depth_routes(model: nn.Module, enabled: bool = True):
    """Make every depth read of `model` keep its last forward's per-token weights (detached; cheap enough
    to leave on during training: n·B·T floats per read) for `diagnostics()`."""
    for module in model.modules():
        if isinstance(module, _DepthRecording):
            module.record_routes = enabled
            module.recorded_routes = {}


def use_reference_depth_read(model: nn.Module, enabled: bool = True):
    """Make every depth read of `model` use `depth_read_reference` (the paper's formula by autograd) instead of
    the fused `depth_read`, or go back to it with `enabled=False`; both compute the same function."""
    for module in model.modules():
        if isinstance(module, _DepthReading):
            module.reference_read = enabled


@torch.no_grad()
def depth_route_report(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
    """Run `model` on a batch and return its depth distributions and the RD-AttnRes JS diagnostic.

    Returns {"layers": [router.diagnostics() per layer], "final": readout.diagnostics(),
    "mean_qk_value_js": mean over layers of the per-token JS between Q/K and V routes (RD-AttnRes only)},
    averaged over the tokens where `attention_mask` is 1.
    """
    routers = [m for m in model.modules() if isinstance(m, BlockAttnResRouter)]
    readouts = [m for m in model.modules() if isinstance(m, BlockAttnResReadout)]
    if not routers:
        raise ValueError("depth_route_report needs a model with depth_routing 'block_attnres' or 'rd_attnres'")
    was_training = model.training
    model.eval()
    record_depth_routes(model, True)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        report = {
            "layers": [router.diagnostics(attention_mask) for router in routers],
            "final": readouts[0].diagnostics(attention_mask),
        }
    finally:
        record_depth_routes(model, False)
        model.train(was_training)
    js = [layer["qk_value_js"] for layer in report["layers"] if "qk_value_js" in layer]
    if js:
        report["mean_qk_value_js"] = sum(js) / len(js)
    return report
