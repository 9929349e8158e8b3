"""Sequence mixers and the generation cache: `SEQUENCE_MIXERS` declares, per value of `config.mixer_types`, the
mixer's module, mask and cache layer; `ValueArchCache` holds one cache layer per decoder layer, chosen by that
layer's sequence mixer and value path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from .kvm import KVMMixer, kvm_padding_mask
from .value_paths import caches_token_ids


class TokenIdsInValueSlot:
    """Mixin for the cache of a table layer (BoV): keys [B, H_kv, T, D] and token ids [B, 1, T, 1], no values.

    The ids sit in the value slot, so growing, cropping, reordering and batch selection work as for K/V; the
    layer's value path gathers gamma * E_V[ids] for all positions at each step (BoV v-cache elimination).
    """

    def lazy_initialization(self, key_states: torch.Tensor, token_ids: torch.Tensor) -> None:
        super().lazy_initialization(key_states, token_ids)
        self.values = torch.tensor([], dtype=token_ids.dtype, device=self.device)  # 5.23 used the keys' dtype

    @property
    def token_ids(self) -> torch.Tensor:
        """[B, T] ids of the cached positions."""
        return self.values[:, 0, :, 0]


class KeysAndTokenIdsLayer(TokenIdsInValueSlot, DynamicLayer):
    """Keys and token ids of every position."""


class SlidingKeysAndTokenIdsLayer(TokenIdsInValueSlot, DynamicSlidingWindowLayer):
    """Keys and token ids of the last `sliding_window - 1` positions (plus the current ones during a step)."""


def attention_cache_layer(config, layer_idx: int) -> CacheLayerMixin:
    """Full attention: keys and values (table layers: keys and token ids) of every position."""
    return KeysAndTokenIdsLayer() if caches_token_ids(config, layer_idx) else DynamicLayer()


def sliding_attention_cache_layer(config, layer_idx: int) -> CacheLayerMixin:
    """Sliding-window attention: keys and values (table layers: keys and token ids) of the last window."""
    if caches_token_ids(config, layer_idx):
        return SlidingKeysAndTokenIdsLayer(config.sliding_window)
    return DynamicSlidingWindowLayer(sliding_window=config.sliding_window)


class KVMCacheLayer(CacheLayerMixin):
    """Cache of a KVM layer (kvm.py): window buffers (k, v, merge gate) and the compressed state.

    `states` holds one `kvm.KVMState` for the whole batch, or one per sequence once a padded batch was seen
    (each sequence then runs on its own tokens). KVM layers never store raw keys and values through `update`.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False
    not_croppable = ("KVM layers merge the tokens that leave their window into a compressed state, which cannot be "
                     "cropped back to fewer tokens; assisted and prompt-lookup decoding need that. Use greedy search, "
                     "sampling or beam search with KVM models.")

    def __init__(self):
        super().__init__()
        self.states: list = []
        self.length = 0  # positions seen, padding included (what the masks of the other layers count)

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("KVM layers write their own state (kvm.KVMMixer), not raw keys and values.")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def nbytes(self) -> int:
        """Bytes held: (window tokens + state slots) * (2 * head_dim + 1) values per KV head and sequence."""
        return sum(t.numel() * t.element_size() for state in self.states for t in state.tensors())

    def reset(self) -> None:
        self.states, self.length = [], 0

    def crop(self, max_length: int) -> None:
        raise ValueError(self.not_croppable)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if len(self.states) == 1:
            self.states = [self.states[0].select_rows(beam_idx.to(self.states[0].state_keys.device))]
        elif self.states:
            self.states = [self.states[int(i)] for i in beam_idx]

    def offload(self):
        pass

    def prefetch(self):
        pass


# --- sequence mixers: one declaration per value of `config.mixer_types` --------------------------------------
# (why `mixer_types` and not transformers' `layer_types`: see the field in configuration_valuearch.py)


TOKEN_ID_BYTES = 8  # table layers cache int64 token ids


def _attention_bytes(config, layer_idx: int, dtype: torch.dtype, tokens: int) -> int:
    """Keys and values of `tokens` positions; a table layer (BoV) keeps an int64 token id instead of its
    H_kv * head_dim values."""
    kv_width = config.num_key_value_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()
    return tokens * (kv_width + (TOKEN_ID_BYTES if caches_token_ids(config, layer_idx) else kv_width))


def attention_cache_bytes(config, layer_idx: int, dtype: torch.dtype, context_length: int) -> int:
    """Full attention keeps every position."""
    return _attention_bytes(config, layer_idx, dtype, context_length)


def sliding_attention_cache_bytes(config, layer_idx: int, dtype: torch.dtype, context_length: int) -> int:
    """Sliding-window attention keeps the last sliding_window - 1 positions."""
    return _attention_bytes(config, layer_idx, dtype, min(context_length, config.sliding_window - 1))


def kvm_cache_bytes(config, layer_idx: int, dtype: torch.dtype, context_length: int) -> int:
    """H_kv * (2 * head_dim + 1) values (keys, values and one radius or merge gate) per state slot in float32 and
    per window token in `dtype`, slots and window from the layer's schedule."""
    with torch.device("meta"):
        slots, window_tokens = KVMMixer(config, layer_idx).cache_size(context_length)
    element = torch.empty((), dtype=dtype).element_size()
    return (slots * 4 + window_tokens * element) * config.num_key_value_heads * (2 * config.head_dim + 1)


@dataclass(frozen=True)
class SequenceMixer:
    """What one value of `config.mixer_types` gives a decoder layer.

    mask: (config, inputs_embeds, attention_mask, cache, position_ids) -> the mask its layers read, built once
        per forward for every mixer present (transformers' mask functions have this signature).
    cache_layer: (config, layer_idx) -> a new generation-cache layer for such a layer. A layer that keeps more
        than keys and values reports its bytes with `nbytes()`; one that cannot be cropped back (assisted
        decoding) sets `is_croppable = False` and may say why in `not_croppable`.
    cache_bytes: (config, layer_idx, dtype, context_length) -> bytes its cache layer holds for one sequence.
    module: None to attend through transformers' attention interface (eager, sdpa, flash, flex); or a module
        class built as module(config, layer_idx) that replaces it, called with q [B, H, T, D], k, v [B, H_kv, T, D]
        (after q/k norm and RoPE), the attention input [B, T, hidden], the mask and the cache, returning
        [B, T, H, D]; it reads and writes its own cache layer (so needs a `ValueArchCache`) and returns no
        per-token attention weights.
    sliding_window: the attention interface attends the last `config.sliding_window` keys (transformers'
        `sliding_window` argument); only for mixers without a module.
    cache_grows_linearly: its cache gains the same bytes with every token (False: bounded or sublinear), what
        `cache_bytes_per_token` counts for a long sequence.
    compiles_fullgraph: whether a forward through such layers traces in one graph (torch.compile(fullgraph=True),
        torch.export); a model claims `_can_compile_fullgraph` only if all its mixers do.
    """

    mask: Callable
    cache_layer: Callable[..., CacheLayerMixin]
    cache_bytes: Callable[..., int]
    module: type[nn.Module] | None = None
    sliding_window: bool = False
    cache_grows_linearly: bool = True
    compiles_fullgraph: bool = True


# mixer name -> declaration; the names are the allowed values of `config.mixer_types`.
SEQUENCE_MIXERS: dict[str, SequenceMixer] = {
    "full_attention": SequenceMixer(mask=create_causal_mask, cache_layer=attention_cache_layer,
                                    cache_bytes=attention_cache_bytes),
    "sliding_attention": SequenceMixer(mask=create_sliding_window_causal_mask,
                                       cache_layer=sliding_attention_cache_layer,
                                       cache_bytes=sliding_attention_cache_bytes, sliding_window=True,
                                       cache_grows_linearly=False),
    # Key-Value Means (kvm.py): window buffers and compressed state, whatever the value path
    # unpadded batches trace in one graph; padded ones run each sequence on its own tokens (a data-dependent split)
    "kvm": SequenceMixer(mask=kvm_padding_mask, cache_layer=lambda config, layer_idx: KVMCacheLayer(),
                         cache_bytes=kvm_cache_bytes, module=KVMMixer, cache_grows_linearly=False,
                         compiles_fullgraph=False),
}


def cache_layer_for(config, layer_idx: int) -> CacheLayerMixin:
    """The cache layer that decoder layer `layer_idx` writes to."""
    return SEQUENCE_MIXERS[config.mixer_types[layer_idx]].cache_layer(config, layer_idx)


class ValueArchCache(Cache):
    """A `transformers.Cache` with a per-layer cache class (full K/V, sliding-window K/V, keys + token ids, ...).

    `generate` builds it (`ValueArchForCausalLM._prepare_cache_for_generation`), and so does a forward with
    `use_cache=True` and no cache, as Llama does with `DynamicCache`.

    With `config.smear_gate`, `smear_inputs` keeps the pre-smear decoder inputs of all cached positions
    ([B, 1, T, D] as its keys; cropped, reordered and selected with the layers), from which the next step's
    smear reads its predecessor.

    With `config.token_shift`, `token_shift_inputs[layer]` maps each shifted stream of that layer ("q", "k", "v",
    "mlp"; `modeling_valuearch.TokenShift`) to its last position [B, 1, C], the next step's predecessor. Only the
    last position is kept, so such a cache cannot be cropped.
    """

    not_croppable_with_token_shift = ("token_shift keeps only the last position of each shifted stream in the cache, "
                                      "which cannot be cropped back to fewer tokens; assisted and prompt-lookup "
                                      "decoding need that. Use greedy search, sampling or beam search.")

    def __init__(self, config):
        super().__init__(layers=[cache_layer_for(config, i) for i in range(config.num_hidden_layers)])
        self.smear_inputs = DynamicLayer() if config.smear_gate else None
        self.token_shift_inputs = [{} for _ in range(config.num_hidden_layers)] if config.token_shift else None

    def _map_token_shift_inputs(self, function):
        for stored in self.token_shift_inputs or ():
            stored.update({name: function(tensor) for name, tensor in stored.items()})

    def nbytes(self) -> int:
        """Bytes of the tensors every layer (and the smear and token-shift inputs) holds (what `cache_bytes`
        predicts)."""
        layers = self.layers if self.smear_inputs is None else [*self.layers, self.smear_inputs]
        shift_inputs = [t for stored in self.token_shift_inputs or () for t in stored.values()]
        return (sum(cache_layer_nbytes(layer) for layer in layers)
                + sum(t.numel() * t.element_size() for t in shift_inputs))

    def not_croppable_reason(self) -> str | None:
        """Why `crop` cannot put this cache back to fewer tokens (assisted decoding needs it to), or None: a layer
        with `is_croppable = False` (its `not_croppable` text), or the token-shift inputs."""
        layer = next((layer for layer in self.layers if not layer.is_croppable), None)
        if layer is not None:
            return getattr(layer, "not_croppable", f"{type(layer).__name__} cannot be cropped, which assisted "
                                                   "decoding needs; use greedy search, sampling or beam search.")
        return self.not_croppable_with_token_shift if self.token_shift_inputs is not None else None

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        if self.smear_inputs is not None:
            self.smear_inputs.reorder_cache(beam_idx)
        self._map_token_shift_inputs(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def crop(self, tokens_to_remove: int) -> None:
        if self.token_shift_inputs is not None:
            raise ValueError(self.not_croppable_with_token_shift)
        super().crop(tokens_to_remove)
        if self.smear_inputs is not None:
            self.smear_inputs.crop(tokens_to_remove)

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        if self.smear_inputs is not None:
            self.smear_inputs.batch_repeat_interleave(repeats)
        self._map_token_shift_inputs(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        if self.smear_inputs is not None:
            self.smear_inputs.batch_select_indices(indices)
        self._map_token_shift_inputs(lambda tensor: tensor[indices])


def cache_layer_nbytes(layer: CacheLayerMixin) -> int:
    """Bytes one cache layer holds: its own count where it has one (KVM state), else its keys and values."""
    if hasattr(layer, "nbytes"):
        return layer.nbytes()
    return sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None)


def check_cache(config, cache) -> None:
    """Raise ValueError if `cache` cannot serve the layers of `config`: layers whose mixer has its own module (KVM)
    or that cache token ids (BoV table layers) keep what only their `ValueArchCache` layers hold (a state; token ids
    instead of values); other layers also take transformers' caches."""
    if cache is None or isinstance(cache, ValueArchCache):
        return
    own_layers = [i for i, mixer in enumerate(config.mixer_types)
                  if SEQUENCE_MIXERS[mixer].module is not None or caches_token_ids(config, i)]
    if own_layers or config.smear_gate or config.token_shift:
        needs = (f"layers {own_layers} (a mixer's own state / BoV token ids)" if own_layers
                 else "smear_gate (smear inputs)" if config.smear_gate else "token_shift (last inputs)")
        raise ValueError(
            f"{needs} need a ValueArchCache, got {type(cache).__name__}; "
            "pass no cache (the model builds its ValueArchCache) or ValueArchCache(config)."
        )


def cache_layer_bytes(config, layer_idx: int, dtype: torch.dtype, context_length: int) -> int:
    """Bytes the cache of layer `layer_idx` holds for one sequence after `context_length` tokens (its mixer's
    `cache_bytes`)."""
    return SEQUENCE_MIXERS[config.mixer_types[layer_idx]].cache_bytes(config, layer_idx, dtype, context_length)


def cache_bytes(config, dtype: torch.dtype, context_length: int, batch_size: int = 1) -> int:
    """Bytes of a `ValueArchCache` after `context_length` tokens of `batch_size` sequences, activations in `dtype`
    (plus, with `smear_gate`, the hidden_size pre-smear inputs of every position, and with `token_shift`, the
    last q, k, v and MLP input of every layer)."""
    smear_bytes = context_length * smear_bytes_per_token(config, dtype)
    return batch_size * (smear_bytes + token_shift_bytes(config, dtype)
                         + sum(cache_layer_bytes(config, i, dtype, context_length)
                               for i in range(config.num_hidden_layers)))


def token_shift_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of the last q, k, v and MLP input every layer keeps for one sequence (`token_shift`), else 0."""
    if not config.token_shift:
        return 0
    widths = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim + config.hidden_size
    return config.num_hidden_layers * widths * torch.empty((), dtype=dtype).element_size()


def smear_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of the pre-smear decoder input the cache keeps per position (`smear_gate`), else 0."""
    return config.hidden_size * torch.empty((), dtype=dtype).element_size() if config.smear_gate else 0


def cache_bytes_per_token(config, dtype: torch.dtype, context_length: int | None = None) -> float:
    """Generation-cache bytes per token of one sequence.

    With `context_length`: cache_bytes / context_length at that length. Without: the growth per token of a long
    sequence, i.e. only layers whose mixer's cache grows linearly count (full attention; sliding-window and KVM
    caches are bounded or grow sublinearly). Standard decoder: 2 * layers * H_kv * head_dim * element size; each
    BoV table layer stores an int64 token id instead of its H_kv * head_dim values.
    """
    if context_length is not None:
        if isinstance(context_length, bool) or not isinstance(context_length, int) or context_length < 1:
            raise ValueError(f"cache_bytes_per_token: context_length={context_length!r} is invalid: expected None "
                             "or an integer >= 1.")
        return cache_bytes(config, dtype, context_length) / context_length
    return float(smear_bytes_per_token(config, dtype)
                 + sum(cache_layer_bytes(config, i, dtype, 1) for i in range(config.num_hidden_layers)
                       if SEQUENCE_MIXERS[config.mixer_types[i]].cache_grows_linearly))
