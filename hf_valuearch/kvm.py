"""Key-Value Means (KVM) attention (Goldstein & Cheah, arXiv:2605.09877; spec_kvm.md A.2-A.6).

A KVM layer attends, with one softmax, over
  * a block sliding window of raw tokens: the current chunk of length C and the n_w - 1 chunks before it;
  * a compressed state of M slots holding raw sums of the keys (S_k) and values (S_v) of every token that
    left the window, read "just in time" as LayerNorm(S_k) and r * S_v / |S_v| (spec A.2).
When a chunk leaves the window, its most surprising tokens are appended as new slots (as many as the growth
schedule allows) and the rest are merged winner-take-all into their most similar slot (spec A.3, A.4).

One code path serves training, prefill, decode and multi-token continuation: `KVMMixer.extend` walks the new
tokens chunk by chunk (batched within a chunk, a Python loop over chunks, spec A.5), updating the state
lazily just before a query needs the window to move, which is exactly when the reference prefill (A.5) and
decode step (A.6) update it, with the same T and A.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace

import torch
from torch import nn
from torch.nn import functional as F

from .functional import repeat_kv


@dataclass
class KVMState:
    """What a KVM layer carries from one call to the next, per sequence and KV head.

    The window holds tokens [seen - W, seen) in the activations' dtype; the state summarises tokens [0, covered)
    in float32 whatever the activations' dtype: its slots are sums over thousands of tokens, which bfloat16
    (8-bit mantissa) would stop accumulating once a sum is a few hundred times larger than a token.
    """

    state_keys: torch.Tensor  # [B, H_kv, M, D]: S_k, raw sums of prepared (gated) keys, float32
    state_values: torch.Tensor  # [B, H_kv, M, D]: S_v, raw sums of (gated) values, float32
    state_radius: torch.Tensor  # [B, H_kv, M, 1]: readout radius r_j, or the count n_j without readout radius, float32
    window_keys: torch.Tensor  # [B, H_kv, W, D]: RoPE'd keys of the window tokens
    window_values: torch.Tensor  # [B, H_kv, W, D]
    window_gates: torch.Tensor  # [B, H_kv, W, 1]: merge gates of the window tokens, used when they leave
    seen: int = 0  # tokens processed so far
    covered: int = 0  # tokens absorbed into the state

    @classmethod
    def empty(cls, like: torch.Tensor) -> KVMState:
        """A state with no tokens, with the batch, heads, head size, dtype and device of `like` [B, H_kv, T, D]."""
        rows = like.new_zeros(*like.shape[:2], 0, like.shape[-1])
        column = like.new_zeros(*like.shape[:2], 0, 1)
        return cls(rows.float(), rows.float(), column.float(), rows, rows, column)

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]

    def select_rows(self, index: torch.Tensor) -> KVMState:
        """The state of the batch rows `index` (beam reordering, splitting a batch into rows)."""
        return replace(self, **{f.name: getattr(self, f.name).index_select(0, index)
                                for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)})

    def without_spare_buffer(self) -> KVMState:
        """This state with its window copied out of the buffer it is a view of when that buffer is more than twice
        its size (after a long prefill, every key of the prompt), so that a cache holds only the window. Under
        torch.compile storage sizes cannot be traced (symbolic shapes): the view is kept."""
        def own(window: torch.Tensor) -> torch.Tensor:
            if torch.compiler.is_compiling():
                return window
            return window.clone() if window.untyped_storage().nbytes() > 2 * window.nbytes else window

        return replace(self, window_keys=own(self.window_keys), window_values=own(self.window_values),
                       window_gates=own(self.window_gates))

    @property
    def num_slots(self) -> int:
        return self.state_keys.shape[2]


def kvm_padding_mask(config, inputs_embeds, attention_mask, cache, position_ids):
    """The mask KVM layers read: the 2D padding mask [B, past + T] (1 = token, 0 = padding) or None."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"KVM layers need a 2D padding mask [batch, length]; got shape {tuple(attention_mask.shape)}.")
    return attention_mask


class KVMMixer(nn.Module):
    """The KVM sequence mixer of one layer; it replaces the attention interface and owns its cache layer.

    Called by `ValueArchAttention` with q [B, H, T, D] and k, v [B, H_kv, T, D] after q/k norm and RoPE,
    and the attention input x [B, T, hidden] for the merge gate; returns [B, T, H, D].
    """

    no_attention_weights = "KVM layers attend over a compressed state and have no per-token attention weights"

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.chunk_size = config.kvm_chunk_size
        self.window_chunks = config.kvm_window_chunks
        self.schedule = config.kvm_state_schedule
        self.min_slots = config.kvm_state_min_slots
        self.max_slots = config.kvm_chunk_size * config.kvm_state_max_chunks
        self.round_down = config.kvm_state_round_down
        self.growth_factor = config.kvm_growth_factor
        self.growth_exponent = config.kvm_growth_exponent
        self.saturation_slots = config.kvm_saturation_slots
        self.sink_slots = config.kvm_sink_slots
        self.readout_radius = config.kvm_readout_radius
        self.gate_appends = config.kvm_merge_gate_appends
        self.readout_dtype = getattr(torch, config.kvm_readout_dtype) if config.kvm_readout_dtype else None
        self.zeroed_dims = config.rotary_dim if config.kvm_zero_state_rope else 0  # RoPE'd dims, first of each head
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.head_dim**-0.5

        self.state_key_norm = nn.LayerNorm(config.head_dim)  # LN_s, shared by the heads as in the reference
        # g = 1 + ELU(w_h . x), one gate per token and KV head (spec A.2)
        self.merge_gate_proj = (nn.Linear(config.hidden_size, config.num_key_value_heads, bias=False)
                                if config.kvm_merge_gate else None)
        if config.kvm_head_temperatures:  # tau^s_h, tau^w_h per query head, initialised to 1 (spec A.2)
            self.state_temperature = nn.Parameter(torch.ones(config.num_attention_heads))
            self.window_temperature = nn.Parameter(torch.ones(config.num_attention_heads))
        else:
            self.state_temperature = self.window_temperature = None
        self.last_states: list[tuple[int, int, int]] = []  # (slots, window tokens, tokens in state) after forward

    def init_valuearch_weights(self, init):
        """Initial values of the parameters transformers' `_init_weights` does not know (spec A.2)."""
        if self.state_temperature is not None:
            init.ones_(self.state_temperature)
            init.ones_(self.window_temperature)

    # --- schedule and window geometry (spec A.4, A.5) ---------------------------------------------------------

    def desired_state_slots(self, context_length: int, left_window: int, current_slots: int) -> int:
        """`_desired_state_len(T, A, M)`: the state size after the chunk ending at A leaves the window."""
        if self.schedule == "fixed":
            target = self.min_slots
        elif self.schedule == "power_law":
            target = math.floor(self.growth_factor * float(context_length) ** self.growth_exponent)
            target = max(target // self.round_down * self.round_down, self.min_slots)
        else:  # "saturating"
            n = float(self.saturation_slots)
            target = math.floor(n * context_length / (n + context_length))
            target = max(target // self.round_down * self.round_down, self.min_slots)
        return max(min(target, left_window, self.max_slots), current_slots)

    def cache_size(self, seen: int) -> tuple[int, int]:
        """(state slots, window tokens) after `seen` tokens; the schedule does not depend on the data, so this
        walks the chunk boundaries `extend` crosses without any tensors."""
        chunk, slots = self.chunk_size, min(seen, self.chunk_size)  # the first chunk enters verbatim
        covered = slots
        while covered < self.window_start(seen):
            desired = self.desired_state_slots(self.window_chunks * chunk + covered, covered + chunk, slots)
            slots += min(desired - slots, chunk)
            covered += chunk
        return slots, seen - self.window_start(seen)

    def window_start(self, length: int) -> int:
        """First raw token the queries of the chunk that ends at `length` see: ceil(T/C)*C - n_w*C, at least 0."""
        chunk_end = -(-length // self.chunk_size) * self.chunk_size
        return max(0, chunk_end - self.window_chunks * self.chunk_size)

    # --- state ------------------------------------------------------------------------------------------------

    def prepare_state_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """k~ = LN_s([0_{rotary dims}, k_rest]) (spec A.2); [..., D] -> [..., D]."""
        if self.zeroed_dims:
            keys = torch.cat((torch.zeros_like(keys[..., : self.zeroed_dims]), keys[..., self.zeroed_dims:]), dim=-1)
        return self.state_key_norm(keys)

    def normed_state_keys(self, state_keys: torch.Tensor) -> torch.Tensor:
        """K^ = LN_s(S_k) in float32 (the sums are float32; LN_s's parameters may be bfloat16)."""
        norm = self.state_key_norm
        return F.layer_norm(state_keys, norm.normalized_shape, norm.weight.float(), norm.bias.float(), norm.eps)

    def merge_gate(self, hidden_states: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
        """g = 1 + ELU(w . x): [B, T, hidden] -> [B, H_kv, T, 1]; ones without a merge gate."""
        if self.merge_gate_proj is None:
            return hidden_states.new_ones(hidden_states.shape[0], num_kv_heads, hidden_states.shape[1], 1)
        return (1.0 + F.elu(self.merge_gate_proj(hidden_states))).transpose(1, 2).unsqueeze(-1)

    def radius_of(self, values: torch.Tensor) -> torch.Tensor:
        """The readout radius |v| of new slots, or a count of 1; float32 (the reference takes the norm in float32)."""
        if self.readout_radius:
            return torch.linalg.vector_norm(values.float(), dim=-1, keepdim=True)
        return torch.ones_like(values[..., :1], dtype=torch.float32)

    def append_slots(self, state: KVMState, keys: torch.Tensor, values: torch.Tensor) -> KVMState:
        """New slots holding prepared `keys` and `values` [B, H_kv, n, D]."""
        return replace(
            state,
            state_keys=torch.cat((state.state_keys, keys.float()), dim=2),
            state_values=torch.cat((state.state_values, values.float()), dim=2),
            state_radius=torch.cat((state.state_radius, self.radius_of(values)), dim=2),
        )

    def absorb_chunk(self, state: KVMState, keys, values, gates, context_length: int, left_window: int) -> KVMState:
        """The chunk [covered, covered + C) leaves the window: surprise appends, then winner-take-all merge (A.3).

        keys, values: [B, H_kv, C, D] (RoPE'd keys); gates: [B, H_kv, C, 1].
        """
        prepared = self.prepare_state_keys(keys)  # k~, ungated
        gated_keys, gated_values = prepared.float() * gates.float(), values.float() * gates.float()  # summed in float32
        slots = state.num_slots
        num_append = min(max(self.desired_state_slots(context_length, left_window, slots) - slots, 0), keys.shape[2])
        merge_keys, merge_values = gated_keys, gated_values
        if num_append > 0:
            with torch.no_grad():  # the least similar tokens to any slot become new slots
                surprise = (prepared.float() @ self.normed_state_keys(state.state_keys).transpose(-1, -2)).amax(dim=-1)
                order = torch.argsort(surprise, dim=-1)  # [B, H_kv, C], most surprising first
                append_index = order[..., :num_append].sort(dim=-1).values
                merge_index = order[..., num_append:].sort(dim=-1).values
            append_keys, append_values = (gated_keys, gated_values) if self.gate_appends else (prepared, values)
            state = self.append_slots(state, gather_tokens(append_keys, append_index),
                                      gather_tokens(append_values, append_index))
            merge_keys, merge_values = gather_tokens(gated_keys, merge_index), gather_tokens(gated_values, merge_index)
        if merge_keys.shape[2] == 0:
            return state
        # every merged token goes to its most similar non-sink slot of the state after this chunk's appends
        similarity = merge_keys @ self.normed_state_keys(state.state_keys).transpose(-1, -2)  # [B, H_kv, n, M]
        similarity[..., : self.sink_slots] = float("-inf")
        slot = similarity.argmax(dim=-1, keepdim=True)  # [B, H_kv, n, 1]
        state = replace(
            state,
            state_keys=state.state_keys.scatter_add(2, slot.expand_as(merge_keys), merge_keys),
            state_values=state.state_values.scatter_add(2, slot.expand_as(merge_values), merge_values),
        )
        if not self.readout_radius:  # counts n_j
            merged_count = torch.ones_like(slot, dtype=torch.float32)
            state = replace(state, state_radius=state.state_radius.scatter_add(2, slot, merged_count))
        return state

    # --- attention --------------------------------------------------------------------------------------------

    def attend(self, queries, window_keys, window_values, state: KVMState | None) -> torch.Tensor:
        """softmax(Q K*^T / sqrt(d) + lower-right causal mask) V* over [state; window] (spec A.2).

        queries [B, H, Tq, D]; window_keys/values [B, H_kv, W, D]; returns [B, H, Tq, D].
        """
        groups = self.num_key_value_groups
        keys, values = repeat_kv(window_keys, groups), repeat_kv(window_values, groups)  # [B, H, W, D]
        if self.window_temperature is not None:
            keys = keys * self.window_temperature[None, :, None, None]
        if state is not None:
            state_keys = repeat_kv(self.normed_state_keys(state.state_keys).to(keys.dtype), groups)  # K^ = LN_s(S_k)
            if self.state_temperature is not None:
                state_keys = state_keys * self.state_temperature[None, :, None, None]
            if self.readout_radius:  # V^ = r * S_v / |S_v|
                state_values = F.normalize(state.state_values, dim=-1) * state.state_radius
            else:  # V^ = S_v / n
                state_values = state.state_values / state.state_radius
            if self.readout_dtype is not None:  # rounded as the readout of the checkpoint's training code was
                state_values = state_values.to(self.readout_dtype)
            state_values = repeat_kv(state_values.to(values.dtype), groups)
            keys = torch.cat((state_keys, keys), dim=2)  # [B, H, M + W, D]
            values = torch.cat((state_values, values), dim=2)
        if queries.shape[2] == keys.shape[2]:  # the queries are all the keys: plain causal attention
            return F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=self.scaling)
        mask = lower_right_causal_mask(queries.shape[2], keys.shape[2], queries.device, queries.dtype)
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=self.scaling)

    def extend(self, state: KVMState, queries, keys, values, gates, row_ends: list[int] | None = None):
        """Process T new tokens after `state` (training, prefill, decode and continuation alike).

        queries [B, H, T, D]; keys, values [B, H_kv, T, D]; gates [B, H_kv, T, 1]. Returns [B, H, T, D] and the
        new state. Queries are taken chunk by chunk (never across a multiple of C), as in spec A.5.

        row_ends: when the rows hold different numbers of tokens (padded rows compacted to the front, see
        `forward`), the `seen` at which each row ends. Queries are then also split at every row end, the state
        of each row is taken there, and a list of one state per row is returned: each the state that row
        reaches alone (tokens after a row's end only meet the state after its snapshot).
        """
        chunk = self.chunk_size
        start, end = state.seen, state.seen + queries.shape[2]
        base = start - state.window_keys.shape[2]  # absolute index of the first buffered token
        buffers = tuple(torch.cat((old, new), dim=2) if old.shape[2] else new for old, new in
                        ((state.window_keys, keys), (state.window_values, values), (state.window_gates, gates)))
        all_keys, all_values, all_gates = buffers
        row_states = {}  # row -> its state, taken when the query loop reaches the row's end

        def take_row_states(state: KVMState, seen: int):
            for row, row_end in enumerate(row_ends or ()):
                if row_end == seen:
                    row_state = state.select_rows(torch.tensor([row], device=keys.device))
                    row_states[row] = self.keep_window(row_state, buffers, base, seen, row)

        take_row_states(state, start)
        batch, heads, length, head_dim = queries.shape
        # [B, H, T, D], stored as [B, T, H, D]: the layout the attention layer reads, so that no copy follows
        output = queries.new_empty(batch, length, heads, head_dim).transpose(1, 2)
        query_start = start
        while query_start < end:
            query_end = min(end, (query_start // chunk + 1) * chunk,
                            *(row_end for row_end in row_ends or () if row_end > query_start))
            initial_end = min(query_end, chunk)  # the first chunk is copied into the state verbatim (sinks, A.3)
            if state.covered < initial_end:
                tokens = slice(state.covered - base, initial_end - base)
                state = self.append_slots(state, self.prepare_state_keys(all_keys[:, :, tokens]),
                                          all_values[:, :, tokens])
                state = replace(state, covered=initial_end)
            window_start = self.window_start(query_end)
            while state.covered < window_start:  # chunks that left the window (one per chunk boundary)
                tokens = slice(state.covered - base, state.covered + chunk - base)
                state = self.absorb_chunk(state, all_keys[:, :, tokens], all_values[:, :, tokens],
                                          all_gates[:, :, tokens],
                                          context_length=self.window_chunks * chunk + state.covered,
                                          left_window=state.covered + chunk)
                state = replace(state, covered=state.covered + chunk)
            window = slice(window_start - base, query_end - base)
            output[:, :, query_start - start: query_end - start] = self.attend(
                queries[:, :, query_start - start: query_end - start], all_keys[:, :, window], all_values[:, :, window],
                state if window_start > 0 else None)
            take_row_states(state, query_end)
            query_start = query_end
        if row_ends is not None:
            return output, [row_states[row] for row in range(keys.shape[0])]
        return output, self.keep_window(state, buffers, base, end)

    def keep_window(self, state: KVMState, buffers, base: int, seen: int, row: int | None = None) -> KVMState:
        """`state` with the window of `seen` tokens, [window_start(seen), seen), cut from `buffers` (window keys,
        values, gates [B, H_kv, L, D] starting at absolute token `base`), all rows or only `row`."""
        kept = slice(self.window_start(seen) - base, seen - base)
        rows = slice(None) if row is None else slice(row, row + 1)
        window_keys, window_values, window_gates = (buffer[rows, :, kept] for buffer in buffers)
        return replace(state, window_keys=window_keys, window_values=window_values, window_gates=window_gates,
                       seen=seen)

    def forward(self, queries, keys, values, hidden_states, attention_mask=None, cache=None) -> torch.Tensor:
        """queries [B, H, T, D]; keys, values [B, H_kv, T, D]; hidden_states [B, T, hidden] -> [B, T, H, D].

        attention_mask: the 2D padding mask [B, past + T] or None. A padded batch gives every sequence the
        outputs it gets alone (padded positions output 0): when all rows share one state (a prefill), each
        row's tokens are moved to the front and the batch runs at once, splitting into one state per row at
        the row ends (`extend(row_ends=...)`); rows that already have their own states run one at a time.
        """
        gates = self.merge_gate(hidden_states, keys.shape[1])
        layer_cache = cache.layers[self.layer_idx] if cache is not None else None
        states = layer_cache.states if layer_cache is not None and layer_cache.states else [KVMState.empty(keys)]
        padding = None if attention_mask is None else attention_mask[:, -queries.shape[2]:].bool()
        if len(states) == 1 and padding is None:
            output, states[0] = self.extend(states[0], queries, keys, values, gates)
        elif len(states) == 1:  # one shared state, padded tokens: compact each row's tokens to the front
            counts = padding.sum(dim=1)  # [B] tokens per row
            order = torch.argsort((~padding).to(torch.int8), dim=1, stable=True)  # [B, T]: tokens first, in order
            order = order[:, : int(counts.max())]  # [B, N]: positions of the compacted tokens
            compacted = [gather_tokens(x, order[:, None, :].expand(-1, x.shape[1], -1))
                         for x in (queries, keys, values, gates)]
            compact_output, states = self.extend(states[0], *compacted, row_ends=(states[0].seen + counts).tolist())
            kept = torch.arange(order.shape[1], device=order.device) < counts[:, None]  # [B, N]: not padding
            output = queries.new_zeros(queries.shape).scatter(
                2, order[:, None, :, None].expand_as(compact_output), compact_output * kept[:, None, :, None])
        else:  # rows with their own states (after a padded prefill): one sequence at a time, without its padding
            output = queries.new_zeros(queries.shape)
            for row in range(keys.shape[0]):
                tokens = (padding[row] if padding is not None
                          else torch.ones(queries.shape[2], dtype=torch.bool, device=queries.device))
                if not tokens.any():
                    continue
                row_output, states[row] = self.extend(
                    states[row], *(x[row: row + 1, :, tokens] for x in (queries, keys, values, gates)))
                output[row: row + 1, :, tokens] = row_output
        if layer_cache is not None:
            layer_cache.states = [state.without_spare_buffer() for state in states]
            layer_cache.length += queries.shape[2]
        self.last_states = [(s.num_slots, s.window_keys.shape[2], s.covered) for s in states]
        return output.transpose(1, 2)

    @torch.no_grad()
    def diagnostics(self) -> dict:
        """Per-head temperatures, merge-gate weight norm per KV head, and the state after the last forward:
        slots, window tokens and tokens summarised in the state, one entry per sequence (or one per batch)."""
        result = {}
        if self.state_temperature is not None:
            result["state_temperature"] = self.state_temperature.detach().cpu().tolist()
            result["window_temperature"] = self.window_temperature.detach().cpu().tolist()
        if self.merge_gate_proj is not None:
            result["merge_gate_weight_norm"] = self.merge_gate_proj.weight.norm(dim=-1).cpu().tolist()
        if self.last_states:
            result["state_slots"], result["window_tokens"], result["tokens_in_state"] = map(list, zip(*self.last_states))
        return result


@functools.lru_cache(maxsize=16)
def lower_right_causal_mask(num_queries: int, num_keys: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[Tq, L] additive mask in `dtype`: 0 where key j is visible to query i, j <= i + (L - Tq) (the queries are
    the last Tq keys), -inf elsewhere (what SDPA would turn a boolean mask into on every call)."""
    query_index = torch.arange(num_queries, device=device)[:, None]
    key_index = torch.arange(num_keys, device=device)[None, :]
    visible = key_index <= query_index + (num_keys - num_queries)
    return torch.zeros(visible.shape, device=device, dtype=dtype).masked_fill_(~visible, float("-inf"))


def gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D], index [B, H, n] -> [B, H, n, D]."""
    return x.gather(2, index.unsqueeze(-1).expand(-1, -1, -1, x.shape[-1]))
