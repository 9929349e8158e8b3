"""Beyond the training length (the KVM group's question): held-out loss of the tokens past the training length, and
needle-in-a-haystack accuracy by context length (the `niah` suite of `hf_valuearch.evaluation`, through lm-eval)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.nn import functional as F

from ..training.data import PackedStream

LOSS_SEQUENCES = 4  # held-out sequences per length
NIAH_DEPTHS = (10, 50, 90)  # needle depth, percent of the context
NIAH_SAMPLES = 2  # per (length, depth) cell


@torch.no_grad()
def loss_by_length(model, corpus: str | None, tokenizer, block_size: int, lengths: list[int]) -> dict[int, float]:
    """Per length L: the mean next-token loss (nats) over the last `block_size` positions of held-out sequences of L
    tokens, i.e. the tokens past the training length when L > block_size (at L = block_size, the usual held-out
    loss). A length the held-out text holds no sequence of is left out."""
    model.eval()
    losses = {}
    for length in lengths:
        stream = PackedStream(corpus, tokenizer, length, held_out=True, max_blocks=LOSS_SEQUENCES)
        sequences = [item["input_ids"] for item in stream]
        if not sequences:
            continue
        ids = torch.stack(sequences)  # [N, L]
        start = length - block_size  # predict positions start + 1 .. L - 1 from the tokens before them
        logits = model(input_ids=ids, use_cache=False).logits[:, start:-1]  # [N, block_size - 1, vocab]
        losses[length] = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, start + 1:].flatten()).item()
    return losses


def niah_by_length(model_dir: Path, output_dir: Path, lengths: list[int]) -> dict[int, float]:
    """Per length: NIAH accuracy (a single needle, words -> numbers) averaged over `NIAH_DEPTHS`, `NIAH_SAMPLES`
    samples per cell, greedy generation through lm-eval; the suite's results.json, summary.md and heatmap stay in
    `output_dir` (reused on a rerun)."""
    results_file = output_dir / "results.json"
    if results_file.is_file():
        record = json.loads(results_file.read_text())
    else:
        from ..evaluation.suites import run_suite

        record = run_suite("niah", str(model_dir), str(output_dir), lengths=list(lengths), depths=list(NIAH_DEPTHS),
                           limit=NIAH_SAMPLES, overwrite=True)
    cells = record["summary"]["niah_grid"]
    return {length: sum(cells[f"{length}_depth{depth}"] for depth in NIAH_DEPTHS) / len(NIAH_DEPTHS)
            for length in lengths}
