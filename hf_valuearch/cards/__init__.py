"""Model cards (the Hub's README.md) generated from a model's config and, optionally, its metrics."""

from __future__ import annotations

import json
from pathlib import Path

# model_type -> the papers a card cites. Architectures add theirs.
PAPERS: dict[str, list[str]] = {
    "valuearch": ["the standard pre-norm decoder of Llama (arXiv:2302.13971), as a baseline"],
    # value paths
    "bov": ["Bank of Values: per-layer token-id value tables in the last third of the layers (arXiv:2606.02780)"],
    "resformer": ["ResFormer value residual learning, V' = lambda_1 V_1 + lambda_2 V (arXiv:2410.17897)"],
    "satformer": ["SATFormer selective access to early representations, V' = V + ReLU(h W_alpha) V_1 "
                  "(arXiv:2605.03953)"],
    # sequence mixers
    "kvm": ["Key-Value Means: a block sliding window plus a compressed, growable state of key/value sums "
            "(arXiv:2605.09877)"],
}


def model_card(model, metrics: dict | None = None) -> str:
    """The README.md text for `model`: front matter, architecture summary, usage, metrics."""
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    mixers = sorted(set(config.mixer_types))
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        f"tags: [hf_valuearch, {config.model_type}]",
        "---",
        "",
        f"# {config.model_type} ({parameters / 1e6:.1f}M parameters)",
        "",
        "Built with hf_valuearch, which implements "
        + "; ".join(PAPERS.get(config.model_type, PAPERS["valuearch"])) + ".",
        "",
        "| field | value |",
        "|---|---|",
        f"| layers x width | {config.num_hidden_layers} x {config.hidden_size} |",
        f"| heads / KV heads / head dim | {config.num_attention_heads} / {config.num_key_value_heads} / {config.head_dim} |",
        f"| value source | {config.value_source} |",
        f"| value path | mix {config.value_mix}, {config.value_coefficients} coefficients, layers "
        f"{config.value_layer_indices or 'none'} |",
        f"| depth routing | {config.depth_routing} |",
        f"| sequence mixers | {', '.join(mixers)} |",
        f"| vocabulary | {config.vocab_size} |",
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("REPO_ID", trust_remote_code=True)',
        'tokenizer = AutoTokenizer.from_pretrained("REPO_ID")',
        "```",
    ]
    if metrics:
        lines += ["", "## Training metrics", "", "```json", json.dumps(metrics, indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def write_model_card(model, directory: str | Path, metrics: dict | None = None) -> Path:
    path = Path(directory) / "README.md"
    path.write_text(model_card(model, metrics))
    return path
