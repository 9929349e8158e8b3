"""Shipping to the Hub: scripts/push_to_hub.py (dry run, broken folders, the upload against a stand-in HfApi),
model.push_to_hub with our card, and clear one-line failures when the Hub cannot be used. Never the real Hub."""

import json
import shutil

import pytest
from huggingface_hub import ModelCard, constants

from hf_valuearch.cards import write_model_card
from hf_valuearch.cards import hub as hub_module
from tests.common import run_script, save_tiny_checkpoint, tiny_model

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ship") / "final"
    save_tiny_checkpoint(folder)
    write_model_card(folder, record={"train_loss": 5.0, "global_step": 3})
    return folder


class StandInHfApi:
    """Records the calls `upload_checkpoint` makes, in place of huggingface_hub.HfApi."""

    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def whoami(self, token=None):
        self.calls.append(("whoami", token))
        return {"name": "me"}

    def create_repo(self, repo_id, private=None, exist_ok=False):
        self.calls.append(("create_repo", repo_id, private, exist_ok))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def create_branch(self, repo_id, branch, exist_ok=False):
        self.calls.append(("create_branch", repo_id, branch, exist_ok))

    def create_commit(self, repo_id, operations, revision=None, create_pr=False, commit_message=None):
        uploaded = {op.path_in_repo: (op.path_or_fileobj if isinstance(op.path_or_fileobj, bytes)
                                      else open(op.path_or_fileobj, "rb").read()) for op in operations}
        self.calls.append(("create_commit", repo_id, revision, uploaded))
        return type("CommitInfo", (), {"commit_url": f"https://hub.local/{repo_id}/commit/1"})()


@pytest.fixture
def stand_in_hub(monkeypatch):
    StandInHfApi.calls = []
    monkeypatch.setattr(hub_module, "HfApi", StandInHfApi)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")
    return StandInHfApi.calls


@pytest.mark.slow
def test_dry_run_loads_without_the_package_and_lists_the_upload(checkpoint, capsys):
    run_script("push_to_hub", str(checkpoint), "--repo-id", "me/tiny", "--dry-run")
    out = capsys.readouterr().out
    assert "loads with trust_remote_code without hf_valuearch: ValueArchForCausalLM" in out
    for name in ("config.json", "model.safetensors", "modeling_valuearch.py", "configuration_valuearch.py",
                 "value_paths.py", "tokenizer.json", "tokenizer_config.json", "training_metrics.json"):
        assert f"  {name} " in out, name
    assert "README.md" in out and "rendered for me/tiny" in out
    assert "training_args.bin" not in out


@pytest.mark.parametrize("broken", ["code file", "weights", "tokenizer", "auto_map"])
def test_broken_folder_fails_with_one_line_naming_what_is_missing(checkpoint, tmp_path, broken, stand_in_hub):
    folder = tmp_path / "broken"
    shutil.copytree(checkpoint, folder)
    if broken == "code file":
        (folder / "value_paths.py").unlink()
        expected = "missing the remote-code file 'value_paths.py'"
    elif broken == "weights":
        (folder / "model.safetensors").unlink()
        expected = "has no weights"
    elif broken == "tokenizer":
        (folder / "tokenizer.json").unlink()
        expected = "has no tokenizer"
    else:
        config = json.loads((folder / "config.json").read_text())
        del config["auto_map"]
        (folder / "config.json").write_text(json.dumps(config))
        expected = "auto_map lacks"
    for mode in (["--dry-run"], []):
        with pytest.raises(SystemExit) as failure:
            run_script("push_to_hub", str(folder), "--repo-id", "me/tiny", *mode)
        message = str(failure.value.code)
        assert message.startswith("push_to_hub.py: error: ") and expected in message and "\n" not in message
    assert not [call for call in stand_in_hub if call[0] != "whoami"]  # nothing was created or uploaded


def test_upload_sends_files_and_card_for_the_repo_id(checkpoint, stand_in_hub, capsys):
    card_before = (checkpoint / "README.md").read_text()
    run_script("push_to_hub", str(checkpoint), "--repo-id", "me/tiny", "--private", "--revision", "dev")
    assert capsys.readouterr().out.strip() == "https://hub.local/me/tiny/commit/1"
    names = [call[0] for call in stand_in_hub]
    assert names == ["whoami", "create_repo", "create_branch", "create_commit"]
    assert stand_in_hub[1] == ("create_repo", "me/tiny", True, True)
    assert stand_in_hub[2] == ("create_branch", "me/tiny", "dev", True)
    _, repo_id, revision, uploaded = stand_in_hub[3]
    assert (repo_id, revision) == ("me/tiny", "dev")
    expected = {p.name for p in checkpoint.iterdir()} - {"training_args.bin"}
    assert set(uploaded) == expected
    for name in expected - {"README.md"}:
        assert uploaded[name] == (checkpoint / name).read_bytes(), name
    card = uploaded["README.md"].decode()
    assert 'AutoModelForCausalLM.from_pretrained("me/tiny", trust_remote_code=True)' in card
    assert 'AutoTokenizer.from_pretrained("me/tiny", trust_remote_code=True)' in card
    assert "hf_valuearch" in ModelCard(card).data.tags
    assert (checkpoint / "README.md").read_text() == card_before  # the folder is not changed


def test_card_written_beside_a_checkpoint_loads_that_folder(checkpoint):
    card = (checkpoint / "README.md").read_text()
    assert f'AutoModelForCausalLM.from_pretrained("{checkpoint}", trust_remote_code=True)' in card
    assert f'AutoTokenizer.from_pretrained("{checkpoint}", trust_remote_code=True)' in card
    assert "REPO_ID" not in card


def test_model_push_to_hub_uploads_our_card(stand_in_hub):
    model = tiny_model("bov")
    url = model.push_to_hub("me/bov-tiny")
    assert url == "https://hub.local/me/bov-tiny/commit/1"
    uploaded = stand_in_hub[-1][3]
    assert {"config.json", "model.safetensors", "modeling_valuearch.py", "README.md"} <= set(uploaded)
    card = ModelCard(uploaded["README.md"].decode())
    assert card.data.library_name == "transformers" and {"hf_valuearch", "bov"} <= set(card.data.tags)
    assert "arXiv:2606.02780" in card.text and "me/bov-tiny" in card.text
    assert "Model Card for Model ID" not in card.text  # transformers' blank template


def test_without_token_or_network_the_upload_fails_with_one_line(checkpoint, monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))
    with pytest.raises(SystemExit, match="push_to_hub.py: error: no Hugging Face token: run `hf auth login`"):
        run_script("push_to_hub", str(checkpoint), "--repo-id", "me/tiny")
    monkeypatch.setenv("HF_TOKEN", "hf_unused")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(SystemExit) as failure:
        run_script("push_to_hub", str(checkpoint), "--repo-id", "me/tiny")
    message = str(failure.value.code)
    assert message.startswith("push_to_hub.py: error: cannot reach the Hugging Face Hub at http://127.0.0.1:9 (")
    assert "\n" not in message


def test_train_push_to_hub_offline_fails_fast_with_one_line(tmp_path, monkeypatch):
    (tmp_path / "corpus.txt").write_text("the value of a token " * 50)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as failure:
        run_script("train", "--config", "valuearch", "--data", str(tmp_path / "corpus.txt"), "--output_dir",
                   str(tmp_path / "run"), "--push_to_hub", "true", "--hub_model_id", "me/run")
    assert failure.value.code == ("error: HF_HUB_OFFLINE is set, so nothing can be pushed to the Hub; "
                                  "unset it to upload")
    assert not (tmp_path / "run").exists()  # failed before any work
