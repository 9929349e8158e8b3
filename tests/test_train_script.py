"""The README's main job: scripts/train.py pretrains, checkpoints atomically and resumes the same run; bad input
gets a one-line error; a finished run has nothing to do."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import Trainer

from hf_valuearch import MODEL_TYPES
from hf_valuearch.training import load_config
from tests.common import REPO, run_script

WORDS = "the a value bank layer token attention residual depth state window query key mean sum of in to".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for index in range(3):  # paragraphs (blank-line separated) are the documents of a text file
        paragraphs = ("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(5))
                      for _ in range(30))
        (root / f"doc{index}.txt").write_text("\n\n".join(paragraphs))
    return root


def common_args(corpus, output, *extra):
    return ["--config", "valuearch", "--data", str(corpus), "--output_dir", str(output),
            "--set", "hidden_size=32", "--set", "intermediate_size=64", "--set", "num_hidden_layers=2",
            "--set", "num_attention_heads=2", "--set", "vocab_size=300", "--block_size", "32",
            "--max_steps", "6", "--save_steps", "3", "--per_device_train_batch_size", "4",
            "--learning_rate", "3e-3", "--disable_tqdm", "true", "--seed", "0", *extra]


def test_train_resume_after_crash_continues_the_same_run(corpus, tmp_path, monkeypatch, capsys):
    # every TrainingArguments field passes through, overriding the script's own defaults (logging_steps)
    run_script("train", *common_args(corpus, tmp_path / "straight", "--report_to", "tensorboard",
                                     "--logging_steps", "1"))
    assert f"final model and tokenizer: {tmp_path / 'straight' / 'final'}" in capsys.readouterr().out
    assert list((tmp_path / "straight" / "runs").rglob("events.out.tfevents.*"))
    straight = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    assert (tmp_path / "straight" / "final" / "tokenizer.json").exists()
    card = (tmp_path / "straight" / "final" / "README.md").read_text()
    assert "- hf_valuearch\n- valuearch\n" in card and "| eval_loss |" in card and "2 layers, width 32" in card

    # Crash while the second checkpoint is being written: it must not appear half-written.
    original = Trainer._save_rng_state

    def crash_at_step_6(self, output_dir):
        if self.state.global_step == 6:
            raise KeyboardInterrupt("simulated crash during checkpoint")
        return original(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", crash_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        run_script("train", *common_args(corpus, tmp_path / "crashed", "--logging_steps", "1"))
    monkeypatch.setattr(Trainer, "_save_rng_state", original)
    checkpoints = sorted(p.name for p in (tmp_path / "crashed").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-3"]

    run_script("train", *common_args(corpus, tmp_path / "crashed", "--logging_steps", "1"))
    resumed = load_file(tmp_path / "crashed" / "final" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.allclose(straight[name], resumed[name], atol=1e-6), name
    # the card's train_loss covers the whole run, not only the resumed steps
    metrics = [json.loads((tmp_path / run / "final" / "training_metrics.json").read_text())
               for run in ("straight", "crashed")]
    assert metrics[1]["train_loss"] == pytest.approx(metrics[0]["train_loss"], rel=1e-5)

    # rerunning a finished run trains nothing and leaves final/ as it is
    card_time = (tmp_path / "crashed" / "final" / "README.md").stat().st_mtime_ns
    run_script("train", *common_args(corpus, tmp_path / "crashed"))
    assert "nothing to do" in capsys.readouterr().out
    assert (tmp_path / "crashed" / "final" / "README.md").stat().st_mtime_ns == card_time


def script_error(*argv) -> str:
    """The one-line error `scripts/train.py ARGV` exits with."""
    with pytest.raises(SystemExit) as exit_info:
        run_script("train", *argv)
    message = str(exit_info.value.code)
    assert "\n" not in message.strip()
    return message


def test_bad_input_gives_one_line_errors(corpus, tmp_path, capsys):
    output = ("--output_dir", str(tmp_path / "o"))
    assert "--data" in script_error("--config", "valuearch", "--data", str(tmp_path / "missing"), *output)
    assert "holds no data files" in script_error("--config", "valuearch", "--data", str(tmp_path), *output)
    assert "model type" in script_error("--config", "not_a_model", *output)
    assert "hidden_size" in script_error("--config", "valuearch", "--set", "hidden_size=0", *output)
    # a typo in --set names the closest field instead of being saved into config.json
    assert "did you mean 'value_source'" in script_error("--config", "bov", "--set", "value_sorce=x0", *output)
    assert "--max_steps 0" in script_error(*common_args(corpus, tmp_path / "zero"), "--max_steps", "0")
    assert "max_position_embeddings=1024" in script_error("--config", "valuearch", "--block_size", "2048", *output)
    binary = tmp_path / "weights.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    assert "binary" in script_error(*common_args(binary, tmp_path / "b"))
    assert script_error(*common_args(corpus, tmp_path / "t"), "--learning_rte", "1") == "2"  # argparse's usage error
    assert "did you mean --learning_rate?" in capsys.readouterr().err


def test_empty_corpus_fails_before_a_tokenizer_is_saved(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    (empty / "b.txt").write_text("\n\n  \n")
    assert "holds no text" in script_error(*common_args(empty, tmp_path / "run"))
    assert not (tmp_path / "run" / "tokenizer").exists()


def test_a_saved_tokenizer_for_another_vocabulary_is_refused(corpus, tmp_path):
    from hf_valuearch.training import resolve_tokenizer

    resolve_tokenizer(None, tmp_path, str(corpus), 300)
    with pytest.raises(ValueError, match="use a new --output_dir, or pass --tokenizer"):
        resolve_tokenizer(None, tmp_path, str(corpus), 2048)
    with pytest.raises(ValueError, match="more than the config's vocab_size=280"):
        resolve_tokenizer(str(tmp_path / "tokenizer"), tmp_path / "other", str(corpus), 280)


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_a_bare_model_type_means_its_tiny_config(model_type):
    config = load_config(model_type)
    assert config.model_type == model_type
    assert config.hidden_size <= 64 and config.num_hidden_layers <= 4 and config.max_position_embeddings >= 256
    assert (REPO / "configs" / "tiny" / f"{model_type}.json").is_file()


def test_kvm_blocks_too_short_for_the_state_make_ddp_search_unused_parameters():
    from hf_valuearch.training import find_unused_parameters

    kvm = load_config(str(REPO / "configs" / "kvm" / "tiny" / "kvm_fixed256.json"))  # needs 25 tokens: 2 x 8 + 8 + 1
    assert find_unused_parameters(kvm, 25, None) == (None, None)  # the Trainer's default stays
    assert find_unused_parameters(kvm, 25, False) == (False, None)
    search, note = find_unused_parameters(kvm, 24, None)
    assert search is True and "--block_size 24 is shorter than the 25 tokens" in note
    with pytest.raises(ValueError, match="--block_size 24 leaves .* at least 25 tokens"):
        find_unused_parameters(kvm, 24, False)
    assert find_unused_parameters(load_config("valuearch"), 8, False) == (False, None)


def test_runs_folder_is_ignored():
    assert "runs/" in (REPO / ".gitignore").read_text().split()


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_the_rerun_finishes(corpus, tmp_path):
    """A real process gets SIGINT mid-run: it saves a checkpoint and exits without a traceback; the rerun
    resumes from that step, and a tied model's resume reports no missing head."""
    argv = [sys.executable, str(REPO / "scripts" / "train.py"),
            *common_args(corpus, tmp_path / "run", "--set", "tie_word_embeddings=true", "--logging_steps", "1")]
    argv[argv.index("--max_steps") + 1] = "100000"
    argv[argv.index("--save_steps") + 1] = "100000"
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in process.stdout:  # wait until training runs
        lines.append(line)
        if "'loss'" in line:
            break
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    output = "".join(lines) + process.stdout.read()
    assert process.wait(timeout=120) == 128 + signal.SIGINT, output
    assert "Traceback" not in output and "stopped by SIGINT" in output
    step = int(sorted((tmp_path / "run").glob("checkpoint-*"))[-1].name.split("-")[1])
    assert step >= 1
    argv[argv.index("--max_steps") + 1] = str(step + 2)
    resumed = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "missing keys" not in resumed.stderr + resumed.stdout
    assert json.loads((tmp_path / "run" / "final" / "training_metrics.json").read_text())["global_step"] == step + 2


@pytest.mark.slow
def test_sigkill_loses_nothing_the_rerun_recomputes(corpus, tmp_path):
    """A real process is SIGKILLed (no handler runs) once a checkpoint exists. Nothing is lost: rerunning the same
    command resumes from the last complete checkpoint and recomputes the steps after it identically, ending with
    the weights and whole-run train_loss of an uninterrupted run."""
    def argv(output):
        arguments = common_args(corpus, output, "--logging_steps", "1", "--eval_strategy", "no")
        arguments[arguments.index("--max_steps") + 1] = "8"
        arguments[arguments.index("--save_steps") + 1] = "2"
        return arguments

    log = tmp_path / "killed.log"
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), *argv(tmp_path / "killed")],
                                   stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "killed").glob("checkpoint-*")):  # checkpoints appear only when complete
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.01)
    process.kill()
    process.wait(timeout=60)
    checkpoints = sorted(int(path.name.split("-")[1]) for path in (tmp_path / "killed").glob("checkpoint-*"))
    assert checkpoints[-1] < 8 and not (tmp_path / "killed" / "final").exists()  # killed mid-run

    run_script("train", *argv(tmp_path / "killed"))
    run_script("train", *argv(tmp_path / "straight"))
    metrics = {run: json.loads((tmp_path / run / "final" / "training_metrics.json").read_text())
               for run in ("killed", "straight")}
    assert metrics["killed"]["resumed_from"].endswith(f"checkpoint-{checkpoints[-1]}")
    assert metrics["killed"]["train_loss"] == pytest.approx(metrics["straight"]["train_loss"], rel=1e-6)
    killed, straight = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("killed", "straight"))
    assert killed.keys() == straight.keys()
    for name in straight:
        assert torch.allclose(killed[name], straight[name], atol=1e-6), name


def test_hub_streaming_path_reads_a_local_dataset_folder(tmp_path):
    """`hf:NAME` goes through datasets' streaming loader; a local dataset folder exercises the same path."""
    from hf_valuearch.training.data import iter_texts

    rows = [{"text": f"document {index}"} for index in range(5)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    assert list(iter_texts(f"hf:{tmp_path}")) == [row["text"] for row in rows]


def test_hub_dataset_offline_fails_with_a_clear_message(tmp_path):
    script = ("from hf_valuearch.training.data import iter_texts\n"
              "next(iter_texts('hf:someone/not-a-local-dataset'))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path),
           "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0
    assert "could not stream Hub dataset 'someone/not-a-local-dataset'" in result.stderr
    assert "pass a local text file or directory" in result.stderr


def test_compile_flag_asks_trainer_to_compile(monkeypatch, tmp_path):
    import hf_valuearch.training

    received = {}
    monkeypatch.setattr(hf_valuearch.training, "pretrain", lambda *args, **kwargs: received.update(kwargs) or {})
    run_script("train", "--config", "valuearch", "--output_dir", str(tmp_path), "--compile")
    assert received["torch_compile"] is True
    received.clear()
    run_script("train", "--config", "valuearch", "--output_dir", str(tmp_path))
    assert "torch_compile" not in received


def test_budgets_set_the_steps(tmp_path):
    from transformers import TrainingArguments

    from hf_valuearch.training import plan_steps
    from hf_valuearch.training.accounting import flops_per_token

    config = load_config("bov")
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2)
    tokens_per_step = 4 * 2 * 64
    assert plan_steps(config, args, 64, None, 10 * tokens_per_step + 1, None)[0] == 11
    steps, summary = plan_steps(config, args, 64, None, None, 7 * tokens_per_step * flops_per_token(config, 64))
    assert steps == 7 and f"7 steps x {tokens_per_step} tokens" in summary
    assert plan_steps(config, args, 64, None, None, None)[0] == 200
    with pytest.raises(ValueError, match="smaller than one step of 512 tokens"):
        plan_steps(config, args, 64, None, None, 1e3)
    with pytest.raises(ValueError, match="give one budget, not --max_steps and --tokens"):
        plan_steps(config, args, 64, 5, 1e6, None)
