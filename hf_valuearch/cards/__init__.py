"""Model cards (the Hub's README.md) generated from a model's config and, optionally, its metrics."""

from __future__ import annotations

import json
from pathlib import Path

from ..presets import PRESETS

def model_card(model, metrics: dict | None = None) -> str:
    """The README.md text for `model`: front matter, architecture summary, usage, metrics."""
    config = model.config
    preset = PRESETS[config.model_type]
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
        f"Built with hf_valuearch, which implements {preset.mechanism} ({preset.paper.title}, "
        f"[arXiv:{preset.paper.arxiv}]({preset.paper.url})). {preset.summary}",
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
        "",
        "## Citation",
        "",
        "```bibtex",
        preset.paper.citation,
        "```",
    ]
    if metrics:
        lines += ["", "## Training metrics", "", "```json", json.dumps(metrics, indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def write_model_card(model, directory: str | Path, metrics: dict | None = None) -> Path:
    path = Path(directory) / "README.md"
    path.write_text(model_card(model, metrics))
    return path
