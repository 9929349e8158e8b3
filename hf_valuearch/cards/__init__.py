"""Model cards (the Hub's README.md) rendered for a checkpoint directory from its saved config and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import MODEL_TYPES, PRESETS

TRAINING_RECORD = "training_metrics.json"  # what the run that wrote the checkpoint reports (metrics, steps, data)

def load_config(directory: Path):
    """The config saved in `directory`, as the class of its model type."""
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} has no config.json: expected a folder written by save_pretrained")
    model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{directory}/config.json has model_type {model_type!r}; hf_valuearch cards cover "
                         f"{sorted(MODEL_TYPES)}")
    return MODEL_TYPES[model_type][0].from_pretrained(directory)


def usage_snippet(repo_id: str) -> str:
    """Loading the checkpoint without hf_valuearch: model and tokenizer both with trust_remote_code."""
    return "\n".join([
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'model = AutoModelForCausalLM.from_pretrained("{repo_id}", trust_remote_code=True)',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)',
        'inputs = tokenizer("The value of", return_tensors="pt")',
        "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))",
        "```",
    ])


def render_model_card(directory: str | Path, repo_id: str | None = None) -> str:
    """The README.md text for the checkpoint in `directory`; the usage snippet loads `repo_id` (default: the
    directory's path)."""
    directory = Path(directory)
    config = load_config(directory)
    with torch.device("meta"):
        model = MODEL_TYPES[config.model_type][2](config)
    parameters = sum(p.numel() for p in model.parameters())
    mixers = sorted(set(config.mixer_types))
    preset = PRESETS[config.model_type]
    record = directory / TRAINING_RECORD
    metrics = json.loads(record.read_text()) if record.is_file() else None
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
        usage_snippet(repo_id or str(directory)),
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


def write_model_card(directory: str | Path, repo_id: str | None = None, training: dict | None = None) -> Path:
    """Write `directory/README.md`; `training` (the run's metrics) is first saved beside it as training_metrics.json, so
    the card can be rendered again later (e.g. for the repo id it is pushed to)."""
    directory = Path(directory)
    if training is not None:
        (directory / TRAINING_RECORD).write_text(json.dumps(training, indent=2, default=str) + "\n")
    path = directory / "README.md"
    path.write_text(render_model_card(directory, repo_id))
    return path
