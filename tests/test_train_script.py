"""The README's main job: scripts/train.py pretrains, checkpoints atomically and resumes the same run."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Trainer

from tests.common import run_script

REPO = Path(__file__).resolve().parent.parent

WORDS = "the a value bank layer token attention residual depth state window query key mean sum of in to".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for index in range(3):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(150))
        (root / f"doc{index}.txt").write_text(text)
    return root


def common_args(corpus, output):
    return ["--config", "valuearch", "--data", str(corpus), "--output_dir", str(output),
            "--set", "hidden_size=32", "--set", "intermediate_size=64", "--set", "num_hidden_layers=2",
            "--set", "num_attention_heads=2", "--set", "vocab_size=300", "--block_size", "32",
            "--max_steps", "6", "--save_steps", "3", "--per_device_train_batch_size", "4",
            "--learning_rate", "3e-3", "--disable_tqdm", "true", "--seed", "0"]


def test_train_resume_after_crash_continues_the_same_run(corpus, tmp_path, monkeypatch):
    run_script("train", *common_args(corpus, tmp_path / "straight"))
    straight = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    assert (tmp_path / "straight" / "final" / "tokenizer.json").exists()
    card = (tmp_path / "straight" / "final" / "README.md").read_text()
    assert "tags: [hf_valuearch, valuearch]" in card and '"eval_loss"' in card and "2 x 32" in card

    # Crash while the second checkpoint is being written: it must not appear half-written.
    original = Trainer._save_rng_state

    def crash_at_step_6(self, output_dir):
        if self.state.global_step == 6:
            raise KeyboardInterrupt("simulated crash during checkpoint")
        return original(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", crash_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        run_script("train", *common_args(corpus, tmp_path / "crashed"))
    monkeypatch.setattr(Trainer, "_save_rng_state", original)
    checkpoints = sorted(p.name for p in (tmp_path / "crashed").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-3"]

    run_script("train", *common_args(corpus, tmp_path / "crashed"))
    resumed = load_file(tmp_path / "crashed" / "final" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.allclose(straight[name], resumed[name], atol=1e-6), name


def test_bad_data_and_config_give_clear_errors(tmp_path):
    output = ("--output_dir", str(tmp_path / "o"))
    with pytest.raises(FileNotFoundError, match="--data"):
        run_script("train", "--config", "valuearch", "--data", str(tmp_path / "missing"), *output)
    with pytest.raises(ValueError, match="holds no text files"):
        run_script("train", "--config", "valuearch", "--data", str(tmp_path), *output)
    with pytest.raises(ValueError, match="model type"):
        run_script("train", "--config", "not_a_model", "--data", str(tmp_path), *output)
    with pytest.raises(ValueError, match="hidden_size"):
        run_script("train", "--config", "valuearch", "--set", "hidden_size=0", "--data", str(tmp_path), *output)


def test_hub_streaming_path_reads_a_local_dataset_folder(tmp_path):
    """`hf:NAME` goes through datasets' streaming loader; a local dataset folder exercises the same path."""
    from hf_valuearch.training import iter_texts

    rows = [{"text": f"document {index}"} for index in range(5)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    assert list(iter_texts(f"hf:{tmp_path}")) == [row["text"] for row in rows]


def test_hub_dataset_offline_fails_with_a_clear_message(tmp_path):
    script = ("from hf_valuearch.training import iter_texts\n"
              "next(iter_texts('hf:someone/not-a-local-dataset'))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path),
           "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0
    assert "could not stream Hub dataset 'someone/not-a-local-dataset'" in result.stderr
    assert "pass a local text file or directory" in result.stderr
