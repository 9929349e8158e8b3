"""scripts/train.py under `accelerate launch` with 2 CPU processes (DDP over gloo, configs/accelerate/ddp_cpu.yaml):
it completes, every checkpoint is staged by all processes and renamed into place once by the main process, the run
resumes, and its losses match a 1-process run with the same global batch."""

import json
import os
import random
import subprocess
import sys

import pytest

from tests.common import REPO

WORDS = "the a value bank layer token attention residual depth state window query key mean sum of in to".split()
TOLERANCE = 1e-4  # absolute, on each logged loss: only the order of float reductions differs


def train(output, corpus, processes: int, max_steps: int):
    argv = [str(REPO / "scripts" / "train.py"), "--config", "valuearch", "--data", str(corpus),
            "--output_dir", str(output), "--max_steps", str(max_steps), "--save_steps", "2", "--block_size", "32",
            "--per_device_train_batch_size", str(4 // processes), "--logging_steps", "1", "--eval_strategy", "no",
            "--disable_tqdm", "true", "--use_cpu", "true", "--seed", "0", "--set", "hidden_size=32",
            "--set", "num_hidden_layers=2", "--set", "vocab_size=300"]
    if processes > 1:
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                    str(REPO / "configs" / "accelerate" / "ddp_cpu.yaml"), "--num_processes", str(processes)]
        command = launcher + argv
    else:
        command = [sys.executable, *argv]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def logged_losses(checkpoint):
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


@pytest.mark.slow
def test_two_processes_checkpoint_once_resume_and_match_one_process(tmp_path):
    rng = random.Random(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(5))
                                  for _ in range(200)))
    train(tmp_path / "two", corpus, processes=2, max_steps=4)
    checkpoints = sorted(p.name for p in (tmp_path / "two").iterdir() if p.name.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-2", "checkpoint-4"]
    assert not list((tmp_path / "two").glob(".staging*"))
    # both processes wrote their RNG state into the staged checkpoint; the main process renamed it once
    assert {p.name for p in (tmp_path / "two" / "checkpoint-4").glob("rng_state_*.pth")} == {
        "rng_state_0.pth", "rng_state_1.pth"}
    assert (tmp_path / "two" / "checkpoint-4" / "model.safetensors").is_file()

    train(tmp_path / "one", corpus, processes=1, max_steps=4)
    two, one = logged_losses(tmp_path / "two" / "checkpoint-4"), logged_losses(tmp_path / "one" / "checkpoint-4")
    assert len(two) == len(one) == 4
    assert max(abs(a - b) for a, b in zip(two, one)) < TOLERANCE, (two, one)

    resumed = train(tmp_path / "two", corpus, processes=2, max_steps=6)
    assert "checkpoint-4" in resumed.stdout + resumed.stderr  # resumed from it
    final = json.loads((tmp_path / "two" / "final" / "training_metrics.json").read_text())
    assert final["global_step"] == 6 and final["resumed_from"].endswith("checkpoint-4")
    assert len(logged_losses(tmp_path / "two" / "checkpoint-6")) == 6
