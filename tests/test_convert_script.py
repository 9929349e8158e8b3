"""scripts/convert.py: the logit-difference report after every conversion, one-line errors on bad input, and
docs that link only to files inside the repository."""

import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_valuearch.conversion import CONVERTERS, load_for_conversion, probe_batch
from tests.common import REPO, run_script

REPORT = re.compile(r"max \|logit difference\| against the source on the probe batch .*: (\S+)\n"
                    r"exact by construction: (yes|no) \(.+\)")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("target", sorted(CONVERTERS))
def test_every_conversion_reports_its_measured_logit_difference(llama_dir, tmp_path, capsys, target):
    run_script("convert", "--input", str(llama_dir), "--output", str(tmp_path / target), "--to", target)
    report = REPORT.search(capsys.readouterr().out)
    assert report is not None
    reported, exact = float(report.group(1)), report.group(2) == "yes"

    source = load_for_conversion(llama_dir)
    converted = load_for_conversion(tmp_path / target)
    ids = probe_batch(source.config.vocab_size)
    with torch.no_grad():
        measured = (converted(ids).logits - source(ids).logits).abs().max().item()
    assert reported == pytest.approx(measured, rel=1e-2, abs=1e-7)  # the printed number is this measurement
    if exact:
        assert measured <= 1e-5
    if target == "bov":  # Llama -> BoV replaces V by aligned tables: a different model, and the report says so
        assert not exact and measured > 1e-2


def test_bov_from_an_x0_substitutive_model_is_exact(tmp_path, capsys):
    from tests.common import tiny_model

    tiny_model("valuearch", value_source="x0", value_layers="last_third", value_coefficients="learnable") \
        .save_pretrained(tmp_path / "x0")
    run_script("convert", "--input", str(tmp_path / "x0"), "--output", str(tmp_path / "bov"), "--to", "bov")
    report = REPORT.search(capsys.readouterr().out)
    assert report.group(2) == "yes" and float(report.group(1)) <= 1e-5


def _config_without_weights(path):
    LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=4).save_pretrained(path)


def _text_files_only(path):
    (path / "notes.txt").write_text("not a checkpoint")


@pytest.mark.parametrize("make_input, message", [
    (lambda path: None, "has no config.json"),
    (_text_files_only, "has no config.json"),
    (_config_without_weights, "the weights do not load"),
    (lambda path: (path / "config.json").write_text("{not json"), "config.json does not load"),
], ids=["empty", "not-a-checkpoint", "config-without-weights", "broken-config"])
def test_bad_input_folder_is_a_one_line_error(tmp_path, make_input, message):
    source = tmp_path / "source"
    source.mkdir()
    make_input(source)
    with pytest.raises(SystemExit) as exit_info:
        run_script("convert", "--input", str(source), "--output", str(tmp_path / "out"), "--to", "valuearch")
    error = exit_info.value.code
    assert isinstance(error, str) and "\n" not in error  # printed as one line, no traceback
    assert error.startswith("convert.py: error:") and message in error
    assert not (tmp_path / "out").exists()


def test_missing_input_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        run_script("convert", "--input", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"), "--to", "bov")
    assert "is not a directory" in exit_info.value.code and "\n" not in exit_info.value.code


# --- docs link only inside the repository ---------------------------------------------------------------

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`([^`\s]*\.(?:md|py|json|yaml|txt))`")


def _docs():
    return [path for path in REPO.rglob("*.md")
            if not any(part.startswith(".") or part in ("runs", "node_modules") for part in path.relative_to(REPO).parts)]


@pytest.mark.parametrize("doc", _docs(), ids=lambda path: str(path.relative_to(REPO)))
def test_docs_link_only_to_files_inside_the_repository(doc):
    text = doc.read_text()
    assert "shared/docs" not in text, f"{doc} points to the developers' shared folder"
    prose = re.sub(r"```.*?```|`[^`]*`", "", text, flags=re.S)  # links live outside code
    for target in MARKDOWN_LINK.findall(prose):  # relative links: an existing file inside the repository
        if re.match(r"[a-z]+:|#", target):
            continue
        resolved = (doc.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(REPO) and resolved.exists(), f"{doc} links to {target}, not a repository file"
    for target in CODE_PATH.findall(text):  # paths written in code spans never climb out of the repository
        assert (doc.parent / target).resolve().is_relative_to(REPO), f"{doc} names {target}, outside the repository"
