"""Shared helpers for the test suite: tiny configs and models (hidden 32-64, 2-4 layers)."""

from __future__ import annotations

import contextlib
import runpy
import sys
from pathlib import Path

import torch

from hf_valuearch import MODEL_TYPES, ValueArchConfig
from hf_valuearch.compat import output_cache

REPO = Path(__file__).resolve().parent.parent

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def tiny_config(model_type: str = "valuearch", **overrides) -> ValueArchConfig:
    """A tiny config of the named architecture; `overrides` replace any field."""
    config_class = MODEL_TYPES[model_type][0]
    return config_class(**{**TINY, **overrides})


def tiny_model(model_type: str = "valuearch", seed: int = 0, **overrides):
    """A tiny causal LM in eval mode, float32, deterministic weights."""
    torch.manual_seed(seed)
    return MODEL_TYPES[model_type][2](tiny_config(model_type, **overrides)).eval()


def save_tiny_checkpoint(folder, model_type: str = "valuearch", **overrides):
    """A tiny model of `model_type` saved with a byte-level BPE tokenizer (300 tokens) in `folder`, as
    scripts/train.py leaves OUTPUT_DIR/final (without the card); returns the model."""
    from hf_valuearch.training import train_tokenizer

    words = "the value of a token bank layer attention residual depth state window query key mean sum".split()
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(20)) for i in range(50)]
    tokenizer = train_tokenizer(texts, vocab_size=300)
    model = tiny_model(model_type, **{**dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
                                      **overrides})
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def random_ids(batch: int, length: int, vocab: int = TINY["vocab_size"], seed: int = 1) -> torch.Tensor:
    """Token ids that avoid the special ids 0-2."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator)


def prefill_then_decode(model, ids: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(full-forward logits, logits of a cached prefill of `ids[:, :prefix]` followed by one-token decode
    steps over the rest), both (B, T, V) and computed without gradients."""
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :prefix], use_cache=True)
        cache, steps = output_cache(out), [out.logits]
        for t in range(prefix, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = output_cache(out)
            steps.append(out.logits)
    return full, torch.cat(steps, dim=1)


@contextlib.contextmanager
def counting_layer_runs(model):
    """While open, counts per decoder layer how often its body runs: once per forward, and once more in backward
    when gradient checkpointing recomputes the layer. Counted as calls of the layer's MLP (inside the checkpointed
    forward), before it runs: the recompute stops early, inside the MLP, once it has what backward needs."""
    runs = [0] * len(model.model.layers)

    def counter(layer_idx):
        def count(module, args):
            runs[layer_idx] += 1
        return count

    handles = [layer.mlp.register_forward_pre_hook(counter(i)) for i, layer in enumerate(model.model.layers)]
    try:
        yield runs
    finally:
        for handle in handles:
            handle.remove()


def left_pad(prompts, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of prompts (each a 1-D tensor or a (1, L) row): (ids, attention_mask), both long."""
    prompts = [prompt.reshape(-1) for prompt in prompts]
    length = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, length - len(prompt):] = prompt
        mask[row, length - len(prompt):] = 1
    return ids, mask


def run_script(name: str, *argv: str) -> None:
    """Run scripts/NAME.py as `python scripts/NAME.py ARGV` does, in this process."""
    saved = sys.argv
    sys.argv = [f"{name}.py", *argv]
    try:
        runpy.run_path(str(REPO / "scripts" / f"{name}.py"), run_name="__main__")
    finally:
        sys.argv = saved
