"""Shipping a checkpoint folder to the Hugging Face Hub: validate it, then upload it with its model card.

Used by `scripts/push_to_hub.py`, `model.push_to_hub(...)` and `scripts/train.py --push_to_hub true`.
A folder ships when it holds what someone without hf_valuearch needs: `config.json` with an `auto_map`, the
remote-code files it names (and their flat sibling imports), safetensors weights, a tokenizer and the card.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, constants, get_token
from huggingface_hub.errors import HTTPError  # the HTTP client's transport errors, as huggingface_hub raises them
from transformers.dynamic_module_utils import get_relative_imports

from . import render_model_card

# Failures of a Hub call: offline mode and HTTP status errors are OSErrors, connection failures HTTPErrors.
HUB_ERRORS = (OSError, HTTPError)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
# Trainer's state, which belongs to the run, not to the model.
NOT_SHIPPED = {"training_args.bin", "trainer_state.json", "optimizer.pt", "scheduler.pt"}


class HubUnavailable(RuntimeError):
    """The Hub cannot be used (offline, no token, unreachable, refused); the message is one line saying why."""


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def check_hub_access(token: str | None = None) -> str:
    """The token to upload with; raises `HubUnavailable` when offline, without a token or when the Hub
    does not answer. Cheap (one `whoami` request), so callers run it before any long work."""
    if constants.HF_HUB_OFFLINE:
        raise HubUnavailable("HF_HUB_OFFLINE is set, so nothing can be pushed to the Hub; unset it to upload")
    token = token or get_token()
    if not token:
        raise HubUnavailable("no Hugging Face token: run `hf auth login` or set HF_TOKEN to upload to the Hub")
    try:
        HfApi().whoami(token=token)
    except HUB_ERRORS as error:
        raise HubUnavailable(f"cannot reach the Hugging Face Hub at {constants.ENDPOINT} ({one_line(error)})") from None
    return token


def check_code_files(folder: Path, auto_map: dict) -> None:
    """Raise ValueError unless `folder` holds the modules `auto_map` names and, recursively, their relative imports."""
    needed, pending = [], [entry.split(".")[0] + ".py" for entry in auto_map.values()]
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        if not (folder / name).is_file():
            raise ValueError(f"{folder} is missing the remote-code file {name!r} (named by config.json's auto_map "
                             "or imported by another code file); save the model with save_pretrained again")
        needed.append(name)
        pending += [f"{module}.py" for module in get_relative_imports(folder / name)]


def checkpoint_files(folder: str | Path, needs_tokenizer: bool = True) -> list[str]:
    """The files of `folder` to upload, after checking it is a complete checkpoint; ValueError names what is
    missing. Every top-level file ships except Trainer state; subfolders (checkpoints, logs) do not."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: expected a folder written by save_pretrained")
    auto_map = json.loads((folder / "config.json").read_text()).get("auto_map") or {}
    missing_classes = {"AutoConfig", "AutoModelForCausalLM"} - set(auto_map)
    if missing_classes:
        raise ValueError(f"{folder}/config.json's auto_map lacks {sorted(missing_classes)}: save the model with "
                         "hf_valuearch imported so that it carries its modeling code")
    check_code_files(folder, auto_map)
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(f"{folder} has no weights: expected one of {list(WEIGHT_FILES)}")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        absent = [shard for shard in shards if not (folder / shard).is_file()]
        if absent:
            raise ValueError(f"{folder} lacks weight shards {absent} listed in model.safetensors.index.json")
    absent = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if needs_tokenizer and absent:
        raise ValueError(f"{folder} has no tokenizer ({absent} missing): save it with tokenizer.save_pretrained")
    return sorted(path.name for path in folder.iterdir() if path.is_file() and not path.name.startswith(".")
                  and path.name not in NOT_SHIPPED and path.name != "README.md")


def card_for_upload(folder: str | Path, repo_id: str) -> str:
    """The README.md uploaded with `folder`: its card rendered for `repo_id`, checked to parse as a Hub card."""
    text = render_model_card(folder, repo_id)
    card = ModelCard(text)
    if card.data.library_name != "transformers" or "hf_valuearch" not in (card.data.tags or []):
        raise ValueError(f"the card rendered for {folder} lacks the metadata library_name: transformers and the tag "
                         "hf_valuearch")
    return text


# Runs in a fresh interpreter where hf_valuearch cannot be imported, as on the machine of someone who downloads
# the checkpoint: the model and tokenizer must load from the folder alone.
REMOTE_LOAD = textwrap.dedent("""
    import sys
    sys.modules["hf_valuearch"] = None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = sys.argv[1]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    ids = tokenizer("The value of a token", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all(), "non-finite logits"
    print(type(model).__name__, sum(p.numel() for p in model.parameters()))
""")


def check_remote_load(folder: str | Path) -> str:
    """Load `folder` with trust_remote_code in a subprocess without hf_valuearch; returns "Class n_params".
    Raises ValueError with the subprocess's last error line when it does not load."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(Path(scratch) / "modules"))
        result = subprocess.run([sys.executable, "-c", REMOTE_LOAD, str(Path(folder).resolve())],
                                cwd=scratch, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["(no output)"]
        raise ValueError(f"{folder} does not load with trust_remote_code without hf_valuearch: {lines[-1]}")
    return result.stdout.strip().splitlines()[-1]


def upload_checkpoint(folder: str | Path, repo_id: str, *, private: bool | None = None, revision: str | None = None,
                      token: str | None = None, commit_message: str | None = None, create_pr: bool = False,
                      needs_tokenizer: bool = True) -> str:
    """Create `repo_id` (and branch `revision`) if needed and upload, in one commit, the checkpoint files and the
    card rendered for `repo_id` (the folder itself is not changed); returns the commit URL. The folder must pass
    `checkpoint_files`; Hub failures raise `HubUnavailable`."""
    folder = Path(folder)
    files, card = checkpoint_files(folder, needs_tokenizer), card_for_upload(folder, repo_id)
    token = check_hub_access(token)
    api = HfApi(token=token)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in files]
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode()))
    try:
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.create_commit(repo_id, operations, revision=revision, create_pr=create_pr,
                                   commit_message=commit_message or "Upload hf_valuearch checkpoint")
    except HUB_ERRORS as error:
        raise HubUnavailable(f"uploading {folder} to {repo_id} failed ({one_line(error)})") from None
    return commit.commit_url


def push_model_to_hub(model, repo_id: str, *, commit_message: str | None = None, private: bool | None = None,
                      token: str | None = None, revision: str | None = None, create_pr: bool = False,
                      max_shard_size: int | str = "50GB") -> str:
    """`model.push_to_hub(repo_id)` for hf_valuearch models: transformers' upload, with this package's model card
    instead of the blank template. Push the tokenizer too (`tokenizer.push_to_hub(repo_id)`), or push a whole
    folder with `scripts/push_to_hub.py`."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, max_shard_size=max_shard_size)
        return upload_checkpoint(folder, repo_id, private=private, revision=revision, token=token,
                                 commit_message=commit_message, create_pr=create_pr, needs_tokenizer=False)
