"""Conversions into the depth-routing architectures (not shipped with checkpoints).

Registered in `conversion.CONVERTERS` as "attnres" and "rd_attnres" (a Llama source first becomes the
standard valuearch decoder, identical logits):

* `valuearch_to_attnres`: a standard valuearch causal LM -> Block AttnRes with the same weights and
  zero pseudo-queries. Every sublayer then reads h / n (h the PreNorm residual stream, n its number of
  sources) and RMSNorm is scale-invariant up to its ε, so the logits equal the source's up to
  RMSNorm(h / n) vs RMSNorm(h): a relative difference of at most ε (n² - 1) / (2 mean(h²)) per norm.
* `attnres_to_rd_attnres`: Block AttnRes -> RD-AttnRes with a learned value route whose query starts as a
  copy of the Q/K query: the two routes start tied, so the logits are identical.
"""

from __future__ import annotations

import torch
from torch import nn

from ..configuration_valuearch import AttnResConfig, RdAttnResConfig
from ..modeling_valuearch import AttnResForCausalLM, RdAttnResForCausalLM
from .common import carried_fields, copy_weights

_DEPTH_FIELDS = ("depth_routing", "attnres_block_size", "value_route")


def valuearch_to_attnres(model: nn.Module, attnres_block_size: int | None = None) -> AttnResForCausalLM:
    """A Block AttnRes copy of a standard-residual causal LM (zero pseudo-queries, key-norm weights one);
    its other axes (value path, mixers) carry over."""
    if model.config.depth_routing != "standard":
        raise ValueError(f"valuearch_to_attnres needs depth_routing='standard', got {model.config.depth_routing!r}")
    fields = carried_fields(model.config, AttnResConfig, exclude=_DEPTH_FIELDS)
    if attnres_block_size is not None:
        fields["attnres_block_size"] = attnres_block_size
    target = AttnResForCausalLM(AttnResConfig(**fields))
    return copy_weights(target, model, new_parameters=("route_",))


def attnres_to_rd_attnres(model: AttnResForCausalLM, value_route: str = "learned") -> RdAttnResForCausalLM:
    """An RD-AttnRes copy of a Block AttnRes model whose V route starts tied to its Q/K route (value_route
    "learned", "tied" or "average"; "frozen" would change the model)."""
    if value_route not in ("learned", "tied", "average"):
        raise ValueError(f"value_route={value_route!r} cannot start tied: allowed are 'learned', 'tied', 'average'")
    if model.config.depth_routing != "block_attnres":
        raise ValueError(f"attnres_to_rd_attnres needs depth_routing='block_attnres', got {model.config.depth_routing!r}")
    fields = carried_fields(model.config, RdAttnResConfig, exclude=_DEPTH_FIELDS)
    config = RdAttnResConfig(**fields, attnres_block_size=model.config.attnres_block_size, value_route=value_route)
    target = copy_weights(RdAttnResForCausalLM(config), model, new_parameters=("value_route_query",))
    with torch.no_grad():
        for layer in target.model.layers:
            if hasattr(layer.router, "value_route_query"):
                layer.router.value_route_query.copy_(layer.router.attn_route_query)
    return target


def to_rd_attnres(model: nn.Module) -> RdAttnResForCausalLM:
    """Block AttnRes -> RD-AttnRes (tied start); a standard-residual model goes through Block AttnRes first."""
    if model.config.depth_routing == "standard":
        model = valuearch_to_attnres(model)
    return attnres_to_rd_attnres(model)
