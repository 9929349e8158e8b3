"""Beyond the training length (the KVM group's question): held-out loss of the same tokens from longer contexts, and
needle-in-a-haystack accuracy by context length (the `niah` suite of `hf_valuearch.evaluation`, through lm-eval)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.nn import functional as F

from ..training.data import PackedStream

LOSS_SEQUENCES = 4  # held-out sequences whose last tokens are scored from every context length
NIAH_DEPTHS = (10, 50, 90)  # needle depth, percent of the context
NIAH_SAMPLES = 2  # per (length, depth) cell


@torch.no_grad()
def loss_by_length(model, corpus: str | None, tokenizer, block_size: int, lengths: list[int]) -> dict[int, float]:
    """Per context length L: the mean next-token loss (nats) of the same targets, the last `block_size - 1` tokens
    of `LOSS_SEQUENCES` held-out sequences, each sequence cut to its last L tokens: contexts past the training
    length when L > block_size (at L = block_size, the usual held-out loss). The sequences are as long as the longest length
    the held-out text fills; longer lengths are left out."""
    model.eval()
    for longest in sorted(lengths, reverse=True):
        stream = PackedStream(corpus, tokenizer, longest, held_out=True, max_blocks=LOSS_SEQUENCES)
        sequences = [item["input_ids"] for item in stream]
        if sequences:
            break
    else:
        return {}
    full = torch.stack(sequences)  # [N, longest]
    targets = full[:, -block_size + 1:].flatten()  # the last block_size - 1 tokens, predicted at every length
    losses = {}
    for length in (length for length in lengths if length <= longest):
        logits = model(input_ids=full[:, -length:], use_cache=False).logits[:, -block_size:-1]  # [N, block - 1, V]
        losses[length] = F.cross_entropy(logits.flatten(0, 1).float(), targets).item()
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
