"""Generation cache: one cache layer per decoder layer, chosen by that layer's sequence mixer."""

from __future__ import annotations

from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer


def cache_layer_for(config, layer_idx: int):
    """The cache layer that decoder layer `layer_idx` writes to."""
    mixer = config.mixer_types[layer_idx]
    if mixer == "sliding_attention":
        return DynamicSlidingWindowLayer(sliding_window=config.sliding_window)
    return DynamicLayer()


class ValueArchCache(Cache):
    """A `transformers.Cache` with a per-layer cache class (full K/V, sliding-window K/V, ...).

    `generate` does not build transformers' `DynamicCache` for these models (see
    `ValueArchPreTrainedModel._supports_default_dynamic_cache`); the model builds this one on the first
    forward with `use_cache=True` and returns it, as Llama does with `DynamicCache`.
    """

    def __init__(self, config):
        super().__init__(layers=[cache_layer_for(config, i) for i in range(config.num_hidden_layers)])
