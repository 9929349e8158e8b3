"""Model cards (the Hub's README.md) rendered for a checkpoint directory.

Each model type has a template, `model_cards/MODEL_TYPE.md` at the top of the repository: the prose (what the model
is, its mechanism) and `${placeholders}` that `render_model_card` fills from the preset declaration (paper,
citation), the saved config, the parameters and cache sizes computed from it, the run's `training_metrics.json`
and, when `scripts/evaluate.py` left one beside the checkpoint, `results.json`. The template's first line names the
config fields its card shows: `<!-- config fields: a, b -->`. The Hub's YAML metadata (library_name, tags, license,
datasets, base_model, model-index) is written by `card_metadata`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from string import Template

import torch
from huggingface_hub import EvalResult, ModelCardData

from .. import MODEL_TYPES, PRESETS
from ..cache_valuearch import cache_bytes_per_token
from ..configuration_valuearch import ValueArchConfig

TEMPLATES = Path(__file__).resolve().parents[2] / "model_cards"
# What produced the checkpoint: the training run's metrics (data, steps, losses) or a conversion's source, as
# `base_model`; scripts/train.py also reads it to tell a finished run.
RECORD = "training_metrics.json"
EVAL_RESULTS = "results.json"  # written by scripts/evaluate.py: {"suite", "model", "lm_eval", "summary", ...}
LICENSE = "apache-2.0"  # the license of the package, whose code files every checkpoint carries
FIELDS_LINE = re.compile(r"<!-- config fields: (.*) -->\n")
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
# The backbone fields a standard transformer of the same shape shares with any model type.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings")


def template_path(model_type: str) -> Path:
    return TEMPLATES / f"{model_type}.md"


def load_config(directory: Path):
    """The config saved in `directory`, as the class of its model type."""
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} has no config.json: expected a folder written by save_pretrained")
    model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{directory}/config.json has model_type {model_type!r}; hf_valuearch cards cover "
                         f"{sorted(MODEL_TYPES)}")
    return MODEL_TYPES[model_type][0].from_pretrained(directory)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def cache_dtype(config) -> torch.dtype:
    """The dtype the checkpoint's activations (and so its cache) use: its saved dtype, float32 if none."""
    dtype = getattr(config, "dtype", None) or torch.float32
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).removeprefix("torch."))


def standard_peer(config) -> ValueArchConfig:
    """The standard transformer of the same shape (full attention, standard values and residual stream)."""
    return ValueArchConfig(**{field: getattr(config, field) for field in SHAPE_FIELDS})


def table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def number(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"`{value}`"
    return f"{value:,}" if isinstance(value, int) else f"{value:.6g}"


def config_section(config, fields: list[str]) -> str:
    shape = (f"{config.num_hidden_layers} layers, width {config.hidden_size}, {config.num_attention_heads} heads "
             f"({config.num_key_value_heads} KV heads) of dimension {config.head_dim}, vocabulary {config.vocab_size:,}, "
             f"context {config.max_position_embeddings:,}")
    return shape + ".\n\n" + table(("field", "value"), [(f"`{field}`", number(getattr(config, field)))
                                                        for field in fields])


def parameters_section(split: dict[str, int], flops: float, context: int) -> str:
    rows = [(kind, f"{count:,}") for kind, count in split.items()] + [("total", f"{sum(split.values()):,}")]
    return (table(("kind", "parameters"), rows) + "\n\n"
            "dense: every weight the forward multiplies or scales (embeddings, projections, norms, gates, scalars); "
            "table: value tables read by token id (lookups, no FLOPs); routing: depth-routing pseudo-queries and "
            f"key norms. Tied weights count once. Training compute: {flops:,.0f} FLOPs per token on {context:,}-token "
            "sequences (forward and backward, counted as the papers do: `hf_valuearch.training.accounting`).")


def cache_section(config) -> str:
    dtype, peer = cache_dtype(config), standard_peer(config)
    context = config.max_position_embeddings
    rows = []
    for label, length in ((f"per token at {context:,} tokens", context), ("per token of a long sequence", None)):
        ours, standard = cache_bytes_per_token(config, dtype, length), cache_bytes_per_token(peer, dtype, length)
        rows.append((label, f"{ours:,.1f}", f"{standard:,.1f}", f"{ours / standard:.3f}"))
    return (table(("generation cache bytes", "this model", "standard transformer, same shape", "ratio"), rows)
            + f"\n\nFor one sequence, activations in {str(dtype).removeprefix('torch.')}; \"long sequence\" counts "
            "only the cache that keeps growing with the context (full-attention layers).")


def training_section(record: dict) -> str:
    if not record:
        return f"No record of how this checkpoint was made (`{RECORD}`) beside it."
    rows = [(key, number(value)) for key, value in record.items() if value is not None and not isinstance(value, dict)]
    return table(("record", "value"), rows)


def evaluation_section(results: dict) -> str:
    summary = results.get("summary") or {}
    if not summary:
        return ("No evaluation results yet: run `python scripts/evaluate.py` on this checkpoint and render the "
                "card again.")
    rows = [(task, metric, number(value)) for task, metrics in summary.items() for metric, value in metrics.items()]
    text = table(("task", "metric", "value"), rows)
    if results.get("core_score") is not None:
        text += f"\n\nCORE score: {number(results['core_score'])}"
    return text


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


def card_metadata(config, repo_id: str, record: dict, results: dict) -> ModelCardData:
    """The Hub's YAML front matter: base_model / datasets only when they name Hub repositories."""
    base_model = str(record.get("base_model") or "")
    data = str(record.get("data") or "")
    eval_results = [EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task, metric_type=metric,
                               metric_name=metric, metric_value=value)
                    for task, metrics in (results.get("summary") or {}).items() for metric, value in metrics.items()]
    return ModelCardData(
        library_name="transformers", pipeline_tag="text-generation", license=LICENSE,
        tags=["hf_valuearch", config.model_type, "custom_code"],
        base_model=base_model if HUB_ID.match(base_model) and not Path(base_model).exists() else None,
        datasets=[data[3:].partition(":")[0]] if data.startswith("hf:") else None,
        model_name=repo_id if eval_results else None, eval_results=eval_results or None,
    )


def render_model_card(directory: str | Path, repo_id: str | None = None) -> str:
    """The README.md text for the checkpoint in `directory`; the usage snippet loads `repo_id` (default: the
    directory's path)."""
    directory = Path(directory)
    config = load_config(directory)
    template = template_path(config.model_type)
    if not template.is_file():
        raise ValueError(f"model type {config.model_type!r} has no card template {template}")
    fields_line = FIELDS_LINE.match(template.read_text())
    if fields_line is None:
        raise ValueError(f"{template} must start with '<!-- config fields: FIELD, ... -->'")
    repo_id = repo_id or str(directory)
    record, results = read_json(directory / RECORD), read_json(directory / EVAL_RESULTS)
    from ..training.accounting import flops_per_token, parameter_split  # here: hf_valuearch.training imports cards

    preset = PRESETS[config.model_type]
    with torch.device("meta"):
        model = MODEL_TYPES[config.model_type][2](config)
    body = Template(template.read_text()[fields_line.end():]).substitute(
        name=repo_id.rstrip("/").split("/")[-1],
        mechanism=preset.mechanism,
        summary=preset.summary,
        paper=f"[{preset.paper.title}]({preset.paper.url}) (arXiv:{preset.paper.arxiv})",
        config=config_section(config, [field.strip() for field in fields_line.group(1).split(",")]),
        parameters=parameters_section(parameter_split(model), flops_per_token(config, config.max_position_embeddings),
                                      config.max_position_embeddings),
        cache=cache_section(config),
        training=training_section(record),
        evaluation=evaluation_section(results),
        usage=usage_snippet(repo_id),
        citation=f"```bibtex\n{preset.paper.citation}\n```",
    )
    return f"---\n{card_metadata(config, repo_id, record, results).to_yaml()}\n---\n\n{body}"


def write_model_card(directory: str | Path, repo_id: str | None = None, record: dict | None = None) -> Path:
    """Write `directory/README.md`; `record` (what produced the checkpoint) is first saved beside it as
    training_metrics.json, so the card can be rendered again later (e.g. for the repo id it is pushed to)."""
    directory = Path(directory)
    if record is not None:
        (directory / RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n")
    path = directory / "README.md"
    path.write_text(render_model_card(directory, repo_id))
    return path
