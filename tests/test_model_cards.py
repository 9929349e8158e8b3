"""Model cards: one template per model type in model_cards/, rendered for a checkpoint directory with the preset's
paper, numbers computed from the checkpoint, the run's record, evaluation results and the Hub metadata."""

import json
import re
from string import Template

import pytest
import torch
from huggingface_hub import ModelCard

from hf_valuearch import MODEL_TYPES
from hf_valuearch.cache_valuearch import cache_bytes_per_token
from hf_valuearch.cards import FIELDS_LINE, card_metadata, render_model_card, template_path, write_model_card
from hf_valuearch.presets import PRESETS
from hf_valuearch.training.accounting import flops_per_token, parameter_split
from tests.common import save_tiny_checkpoint

ALL_TYPES = sorted(MODEL_TYPES)
PLACEHOLDERS = {"name", "mechanism", "summary", "paper", "config", "parameters", "cache", "training", "evaluation",
                "usage", "citation"}
RESULTS = {"suite": "core", "model": "tiny", "lm_eval": {}, "summary": {"hellaswag": {"acc_norm": 0.3125},
                                                                         "arc_easy": {"acc": 0.5, "acc_norm": 0.25}},
           "core_score": 0.0625}


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_every_model_type_has_a_template(model_type):
    """A new model type fails here until model_cards/MODEL_TYPE.md exists."""
    path = template_path(model_type)
    assert path.is_file(), f"model type {model_type!r} has no card template {path}"
    text = path.read_text()
    fields = FIELDS_LINE.match(text)
    assert fields, f"{path} must start with '<!-- config fields: ... -->'"
    config = MODEL_TYPES[model_type][0]()
    for field in fields.group(1).split(","):
        assert hasattr(config, field.strip()), (path, field)
    assert set(Template(text).get_identifiers()) == PLACEHOLDERS, path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("cards")
    for model_type in ALL_TYPES:
        folder = root / model_type
        save_tiny_checkpoint(folder, model_type)
        (folder / "results.json").write_text(json.dumps(RESULTS))
        write_model_card(folder, repo_id=f"me/{model_type}-tiny",
                         record={"train_loss": 2.5, "global_step": 7, "data": "hf:HuggingFaceFW/fineweb-edu:sample"})
    return root


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_card_names_the_paper_and_its_numbers_are_the_checkpoints(model_type, checkpoints):
    folder = checkpoints / model_type
    card = ModelCard.load(folder / "README.md")
    paper = PRESETS[model_type].paper
    assert paper.title in card.text and f"arXiv:{paper.arxiv}" in card.text and paper.citation in card.text
    assert f"Model type `{model_type}`" in card.text

    model = MODEL_TYPES[model_type][2].from_pretrained(folder)
    config = model.config
    split = parameter_split(model)
    for kind, count in split.items():
        assert f"| {kind} | {count:,} |" in card.text, kind
    assert f"| total | {sum(split.values()):,} |" in card.text
    context = config.max_position_embeddings
    assert f"{flops_per_token(config, context):,.0f} FLOPs per token on {context:,}-token sequences" in card.text
    # the standard transformer's cache by hand: keys and values of every layer, float32
    standard = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    for label, length in ((f"per token at {context:,} tokens", context), ("per token of a long sequence", None)):
        ours = cache_bytes_per_token(config, torch.float32, length)
        assert f"| {label} | {ours:,.1f} | {standard:,.1f} | {ours / standard:.3f} |" in card.text, label
    for field in FIELDS_LINE.match(template_path(model_type).read_text()).group(1).split(","):
        assert f"| `{field.strip()}` |" in card.text

    assert 'AutoTokenizer.from_pretrained("me/' + model_type + '-tiny", trust_remote_code=True)' in card.text
    assert "| global_step | 7 |" in card.text and "CORE score: 0.0625" in card.text
    data = card.data
    assert data.library_name == "transformers" and data.license == "apache-2.0"
    assert data.tags == ["hf_valuearch", model_type, "custom_code"]
    assert data.datasets == ["HuggingFaceFW/fineweb-edu"]
    assert data.base_model is None
    results = {(r.dataset_type, r.metric_type): r.metric_value for r in data.eval_results}
    assert results == {(task, metric): value for task, metrics in RESULTS["summary"].items()
                       for metric, value in metrics.items()}


def test_cards_render_again_for_another_repo_id(checkpoints):
    text = render_model_card(checkpoints / "bov", "org/renamed")
    assert "# renamed\n" in text and 'from_pretrained("org/renamed", trust_remote_code=True)' in text
    assert "name: org/renamed" in text  # model-index


def test_base_model_names_a_hub_source_only(checkpoints):
    config = MODEL_TYPES["bov"][0]()
    assert card_metadata(config, "me/x", {"base_model": "meta-llama/Llama-3.2-1B"}, {}).base_model \
        == "meta-llama/Llama-3.2-1B"
    assert card_metadata(config, "me/x", {"base_model": str(checkpoints / "bov")}, {}).base_model is None
    metadata = card_metadata(config, "me/x", {"data": "corpus.txt"}, {})
    assert metadata.datasets is None and metadata.eval_results is None


def test_converted_checkpoint_card_records_its_source(tmp_path):
    from tests.common import run_script

    save_tiny_checkpoint(tmp_path / "source")
    run_script("convert", "--input", str(tmp_path / "source"), "--output", str(tmp_path / "bov"), "--to", "bov")
    card = (tmp_path / "bov" / "README.md").read_text()
    assert "Model type `bov`" in card
    assert re.search(rf"\| base_model \| `{re.escape(str(tmp_path / 'source'))}` \|", card)


def test_a_model_type_without_template_fails_clearly(checkpoints, monkeypatch, tmp_path):
    monkeypatch.setattr("hf_valuearch.cards.TEMPLATES", tmp_path)
    with pytest.raises(ValueError, match="model type 'kvm' has no card template"):
        render_model_card(checkpoints / "kvm")
