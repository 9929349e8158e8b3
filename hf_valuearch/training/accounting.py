"""Parameter and compute accounting as the papers count it (used for budgets, model cards and benchmarks).

Training FLOPs per token follow nanochat's `estimate_flops`, which the BoV paper (arXiv:2606.02780, §5 and
spec_value_paths.md §1.2) uses to match compute across variants:

    6 * N_matmul  +  12 * H * D_head * context  (per layer)  +  depth reads (AttnRes)

* N_matmul counts the weights of matrix multiplies: every dense matrix except the input embedding (a lookup),
  with the LM head counted once even when tied. Table lookups (BoV value tables) cost no FLOPs, and BoV table
  layers hold no `v_proj` (the paper's "c_v is dead at target layers ... excluded from the FLOP count"). Norm weights
  and scalars (gamma, temperatures, pseudo-queries) are not matmuls.
* The attention term is nanochat's `12 * h * q * effective_seq`: QK^T and AV, forward and backward, over the
  keys one query sees at the end of a `seq_len` sequence: all of them (full attention), the window (sliding
  attention), or KVM's window of `kvm_window_chunks * kvm_chunk_size` raw tokens plus its state slots
  (spec_kvm.md A.5: per chunk O(C * (M + n_w * C) * d)).
* Block AttnRes / RD-AttnRes reads: per read over S sources and q queries, logits and mixture are 2 * q * S * d
  multiply-adds, i.e. 12 * q * S * d FLOPs forward and backward (arXiv:2603.15031 §3, Eq. 6).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import MODEL_TYPES
from ..depth_routing import BlockAttnResReadout, BlockAttnResRouter
from ..kvm import KVMMixer


def _parameter_kinds(model: nn.Module) -> dict[str, str]:
    """{parameter name: "dense" | "table" | "routing"} for every parameter the forward uses (tied ones once)."""
    routing = {f"{module_name}.{name}" if module_name else name
               for module_name, module in model.named_modules()
               if isinstance(module, (BlockAttnResRouter, BlockAttnResReadout))
               for name, _ in module.named_parameters()}
    kinds = {}
    for name, _ in model.named_parameters():
        if name in routing:
            kinds[name] = "routing"
        elif name.endswith("value_table.weight"):
            kinds[name] = "table"
        else:
            kinds[name] = "dense"
    return kinds


def parameter_split(model: nn.Module) -> dict[str, int]:
    """Trained parameters by kind: {"dense": n, "table": n, "routing": n}.

    table: BoV value tables (lookups). routing: Block AttnRes / RD-AttnRes pseudo-queries and key norms.
    dense: everything else the forward uses (embeddings, projections, norms, gates, scalars). Tied weights
    count once (BoV table layers hold no `v_proj`: it would never run).
    """
    split = {"dense": 0, "table": 0, "routing": 0}
    parameters = dict(model.named_parameters())
    for name, kind in _parameter_kinds(model).items():
        split[kind] += parameters[name].numel()
    return split


def _meta_model(config) -> nn.Module:
    """The causal LM of `config`, with parameters on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        return MODEL_TYPES[config.model_type][2](config)


def _kvm_context(mixer: KVMMixer, seq_len: int) -> int:
    """Keys the last query of a `seq_len` sequence attends in a KVM layer: raw window + state slots (kvm.py)."""
    chunk, window_chunks = mixer.chunk_size, mixer.window_chunks
    window_start = mixer.window_start(seq_len)
    if window_start == 0:  # the whole sequence is still in the window: no state read
        return seq_len
    slots, covered = chunk, chunk  # the first chunk enters the state verbatim (sinks, spec A.3)
    while covered < window_start:  # one `absorb_chunk` per chunk that left the window
        slots = mixer.desired_state_slots(window_chunks * chunk + covered, covered + chunk, slots)
        covered += chunk
    return (seq_len - window_start) + slots


def shortest_block_training_every_parameter(config) -> int | None:
    """The fewest tokens a training sequence needs for every KVM parameter to get a gradient; None without KVM
    layers. KVM reads its state once the first chunk leaves the raw window (length > n_w * C), which trains the
    state key norm; the merge gate g scales the chunks absorbed after that first, verbatim one (spec_kvm.md A.3):
    appended slots when `kvm_merge_gate_appends`, else only merged tokens, so with growing states and ungated
    appends it waits for the first chunk that does not fit into new slots."""
    if "kvm" not in config.mixer_types:
        return None
    with torch.device("meta"):
        mixer = KVMMixer(config, layer_idx=0)
    chunk, window = mixer.chunk_size, mixer.window_chunks * mixer.chunk_size
    if mixer.merge_gate_proj is None:
        return window + 1
    slots, covered = chunk, chunk  # the first chunk enters the state verbatim, ungated
    while True:  # the chunk [covered, covered + C) leaves the window at length covered + window + 1
        desired = mixer.desired_state_slots(window + covered, covered + chunk, slots)
        appended = min(max(desired - slots, 0), chunk)
        if mixer.gate_appends or appended < chunk or covered + window >= config.max_position_embeddings:
            return covered + window + 1
        slots, covered = slots + appended, covered + chunk


def _depth_read_sources(config) -> list[tuple[int, int]]:
    """(queries, sources) of every depth read of (RD-)AttnRes: per sublayer s, ceil(s / S) completed blocks
    plus the partial block; the final read sees all of them (arXiv:2603.15031 Eq. 6)."""
    block_size, sublayers = config.attnres_block_size, 2 * config.num_hidden_layers
    attention_queries = 2 if config.depth_routing == "rd_attnres" else 1  # every value route runs both reads
    reads = []
    for sublayer in range(sublayers):
        queries = attention_queries if sublayer % 2 == 0 else 1
        reads.append((queries, math.ceil(sublayer / block_size) + 1))
    reads.append((1, math.ceil(sublayers / block_size) + 1))
    return reads


def flops_breakdown(config, seq_len: int) -> dict[str, float]:
    """Training FLOPs per token (forward + backward) by term: {"matmul", "attention", "depth_routing"}."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} is invalid: expected an integer >= 1")
    model = _meta_model(config)
    parameters = dict(model.named_parameters())
    input_embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    matmul = head.numel() + sum(
        parameters[name].numel() for name, kind in _parameter_kinds(model).items()
        if kind == "dense" and parameters[name].dim() >= 2
        and parameters[name] is not input_embedding and parameters[name] is not head
    )
    heads_width = config.num_attention_heads * config.head_dim
    attention = 0
    for layer in model.model.layers:
        mixer_type = layer.self_attn.mixer_type
        if mixer_type == "kvm":
            context = _kvm_context(layer.self_attn.sequence_mixer, seq_len)
        elif mixer_type == "sliding_attention":
            context = min(config.sliding_window, seq_len)
        else:
            context = seq_len
        attention += 12 * heads_width * context
    depth_routing = 0
    if config.depth_routing != "standard":
        depth_routing = sum(12 * queries * sources * config.hidden_size
                            for queries, sources in _depth_read_sources(config))
    return {"matmul": 6.0 * matmul, "attention": float(attention), "depth_routing": float(depth_routing)}


def flops_per_token(config, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of `config` on `seq_len`-token sequences; see the module
    docstring for what is counted."""
    return sum(flops_breakdown(config, seq_len).values())
