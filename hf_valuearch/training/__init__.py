"""Pretraining with transformers' Trainer: corpus -> tokenizer -> packed blocks -> model -> checkpoints.

Used by `scripts/train.py`. Not shipped inside checkpoints (remote code never imports it).

* Data: a local text file or directory (every text file below it), or `hf:NAME[:CONFIG]` for a Hub
  dataset streamed with `datasets` (fails with a clear message when offline).
* Tokenizer: a local tokenizer directory, or a byte-level BPE trained on the corpus itself.
* Checkpoints are written atomically (staged in `.staging/`, then renamed into place), and a run
  restarted with the same output directory resumes from its last complete checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints

from .. import MODEL_TYPES
from ..cards import write_model_card
from ..cards.hub import check_hub_access, upload_checkpoint

# TrainingArguments' Hub options, handled here: the access check runs before any work, and the final folder is
# uploaded with its model card (Trainer's own push would fail late, after a long traceback, with a blank card).
HUB_ARGUMENTS = ("push_to_hub", "hub_model_id", "hub_token", "hub_private_repo", "hub_revision")
TEXT_SUFFIXES = {".txt", ".rst", ".md", ".text", ".jsonl"}
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2: the configs' pad/bos/eos defaults


def load_config(spec: str, overrides: dict | None = None):
    """A config from a JSON file (its `model_type` picks the class) or a model type's defaults, plus overrides."""
    path = Path(spec)
    if path.suffix == ".json":
        if not path.is_file():
            raise FileNotFoundError(f"config file {spec!r} does not exist")
        fields = json.loads(path.read_text())
    elif spec in MODEL_TYPES:
        fields = {"model_type": spec}
    else:
        raise ValueError(f"--config {spec!r} is neither a .json file nor a model type; model types: {sorted(MODEL_TYPES)}")
    model_type = fields.pop("model_type", "valuearch")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} in {spec!r} is unknown; allowed: {sorted(MODEL_TYPES)}")
    return MODEL_TYPES[model_type][0](**{**fields, **(overrides or {})})


def iter_texts(data: str) -> Iterator[str]:
    """Documents of a local file/directory, or of a Hub dataset given as `hf:NAME[:CONFIG]` (its `text` column)."""
    if data.startswith("hf:"):
        from datasets import load_dataset

        name, _, config_name = data[3:].partition(":")
        try:
            dataset = load_dataset(name, config_name or None, split="train", streaming=True)
            for row in dataset:
                yield row["text"]
        except (ConnectionError, OSError) as error:
            raise RuntimeError(
                f"could not stream Hub dataset {name!r} ({error}). Without network access, pass a local "
                "text file or directory instead."
            ) from error
        return
    path = Path(data)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    else:
        raise FileNotFoundError(f"--data {data!r} is neither a file, a directory nor hf:NAME")
    if not files:
        raise ValueError(f"--data {data!r} holds no text files (suffixes {sorted(TEXT_SUFFIXES)})")
    for file in files:
        yield file.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of `vocab_size` entries trained on `texts`; ids 0-2 are pad/bos/eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


class PackedBlocks(torch.utils.data.Dataset):
    """The corpus as one token stream (documents joined by eos), cut into blocks of `block_size` tokens."""

    def __init__(self, token_ids: torch.Tensor, block_size: int):
        count = len(token_ids) // block_size
        if count == 0:
            raise ValueError(f"the corpus has {len(token_ids)} tokens, fewer than one block of {block_size}")
        self.blocks = token_ids[: count * block_size].view(count, block_size)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, index):
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


def tokenize_corpus(texts: list[str], tokenizer) -> torch.Tensor:
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


class AtomicCheckpointTrainer(Trainer):
    """A Trainer whose checkpoints appear only when complete: written to `.staging/`, then renamed."""

    def _save_checkpoint(self, model, trial):
        run_dir = self._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = os.path.join(run_dir, ".staging")
        shutil.rmtree(staging_root, ignore_errors=True)
        output_dir = self.args.output_dir
        self.args.output_dir = staging_root  # Trainer writes `<output_dir>/checkpoint-N`
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = output_dir
        final = os.path.join(run_dir, name)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(os.path.join(staging_root, name), final)
        shutil.rmtree(staging_root, ignore_errors=True)
        if self.args.should_save:
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=False)


def pretrain(
    config_spec: str,
    data: str,
    output_dir: str,
    tokenizer_path: str | None = None,
    overrides: dict | None = None,
    block_size: int = 256,
    eval_fraction: float = 0.02,
    **training_arguments,
) -> dict:
    """Pretrain a model from scratch and save it with its tokenizer; returns the final metrics.

    With `push_to_hub=True` the final folder is uploaded to `hub_model_id` (default: the output directory's name);
    the Hub must be reachable with a token before training starts (else `HubUnavailable`)."""
    output = Path(output_dir)
    hub = {key: training_arguments.pop(key) for key in HUB_ARGUMENTS if key in training_arguments}
    if hub.get("push_to_hub"):
        hub["hub_token"] = check_hub_access(hub.get("hub_token"))
    vocab_size = load_config(config_spec, overrides).vocab_size  # a bad config fails before any work
    texts = list(iter_texts(data))
    if tokenizer_path:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    elif (output / "tokenizer").is_dir():  # a resumed run keeps the tokenizer it started with
        tokenizer = AutoTokenizer.from_pretrained(output / "tokenizer")
    else:
        tokenizer = train_tokenizer(texts, vocab_size)
        tokenizer.save_pretrained(output / "tokenizer")
    config = load_config(config_spec, {
        "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, **(overrides or {}),
    })
    tokens = tokenize_corpus(texts, tokenizer)
    split = len(tokens) - max(block_size + 1, math.ceil(len(tokens) * eval_fraction))
    train_data, eval_data = PackedBlocks(tokens[:split], block_size), PackedBlocks(tokens[split:], block_size)

    args = TrainingArguments(output_dir=str(output), report_to=[], **training_arguments)
    set_seed(args.seed)  # the initial weights are part of the run: same seed, same model
    model = MODEL_TYPES[config.model_type][2](config)
    trainer = AtomicCheckpointTrainer(model=model, args=args, train_dataset=train_data, eval_dataset=eval_data)
    last_checkpoint = get_last_checkpoint(str(output)) if output.is_dir() else None
    result = trainer.train(resume_from_checkpoint=last_checkpoint)
    metrics = {"train_loss": result.training_loss, "global_step": result.global_step,
               "resumed_from": last_checkpoint, **trainer.evaluate()}
    trainer.save_model(str(output / "final"))
    tokenizer.save_pretrained(output / "final")
    write_model_card(output / "final", training=metrics)
    if hub.get("push_to_hub"):
        metrics["hub_commit"] = upload_checkpoint(output / "final", hub.get("hub_model_id") or output.resolve().name,
                                                  private=hub.get("hub_private_repo"), revision=hub.get("hub_revision"),
                                                  token=hub["hub_token"])
    return metrics
