"""Model cards (the Hub's README.md) rendered for a checkpoint directory from its saved config and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from .. import MODEL_TYPES

TRAINING_RECORD = "training_metrics.json"  # what the run that wrote the checkpoint reports (metrics, steps, data)

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
        usage_snippet(repo_id or str(directory)),
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
