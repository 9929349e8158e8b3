"""Fine-tuning a saved model with transformers' Trainer: all weights, or LoRA adapters (PEFT).

Used by `scripts/finetune.py`. Data:

* a .jsonl file whose rows have "prompt" and "completion": one example per row, prompt + completion + eos,
  the loss on the completion (and eos) only: the prompt's labels are -100;
* anything `scripts/train.py --data` reads (text, .jsonl rows with "text", parquet, a folder, hf:NAME): the
  documents packed into blocks with eos between them, the loss on every token, and the same held-out documents
  for `eval_loss` (`training.data`).

Mechanism parameters (BoV value tables and gamma, ResFormer scales, SATFormer gates, AttnRes pseudo-queries and
key norms, KVM gates, temperatures and state norms: the parameters of the modules that define `diagnostics()`,
see `valuearch_diagnostics`) train with full fine-tuning and stay frozen under LoRA unless `train_mechanism`
says otherwise; under LoRA they are then saved with the adapter (PEFT `modules_to_save`).
LoRA's default target modules (`LoraConfig()` without `target_modules`) are registered by `import hf_valuearch`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

from .. import MODEL_TYPES
from ..cards import write_model_card
from . import AtomicCheckpointTrainer, find_unused_parameters, replace_directory
from .data import HeldOutBlocks, PackedStream
from .optim import OptimizerRecipe

IGNORE_INDEX = -100  # labels the loss skips (transformers' ForCausalLMLoss)


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} line {number} is not JSON ({error.msg})") from None
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return rows


class PromptCompletions(torch.utils.data.Dataset):
    """One example per (prompt, completion): ids = prompt + completion + eos, labels -100 on the prompt."""

    def __init__(self, rows: list[dict], tokenizer, block_size: int):
        self.examples = []
        for number, row in enumerate(rows, start=1):
            prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
            completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            if len(prompt) >= block_size:
                raise ValueError(f"row {number}: the prompt has {len(prompt)} tokens, leaving none of the completion "
                                 f"inside --block_size {block_size}")
            ids = (prompt + completion)[:block_size]
            labels = ([IGNORE_INDEX] * len(prompt) + completion)[:block_size]
            self.examples.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)})

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, index):
        return self.examples[index]


class PadToLongest:
    """Right-pads a batch of examples to its longest: pad id in input_ids, -100 in labels, 0 in attention_mask."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: list[dict]) -> dict:
        length = max(len(example["input_ids"]) for example in examples)
        batch = {"input_ids": torch.full((len(examples), length), self.pad_token_id),
                 "labels": torch.full((len(examples), length), IGNORE_INDEX),
                 "attention_mask": torch.zeros(len(examples), length, dtype=torch.long)}
        for row, example in enumerate(examples):
            n = len(example["input_ids"])
            batch["input_ids"][row, :n] = example["input_ids"]
            batch["labels"][row, :n] = example["labels"]
            batch["attention_mask"][row, :n] = 1
        return batch


def is_prompt_completion_file(path: Path) -> bool:
    """Whether `path` is a .jsonl file whose first row has "prompt" or "completion"."""
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with open(path, encoding="utf-8") as file:
        first = next((line for line in file if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and ("prompt" in row or "completion" in row)


def prompt_completions(path: Path, tokenizer, block_size: int) -> PromptCompletions:
    """The examples of a prompt/completion .jsonl file; every row must have string "prompt" and "completion"."""
    rows = read_jsonl(path)
    for number, row in enumerate(rows, start=1):
        if not (isinstance(row, dict) and isinstance(row.get("prompt"), str)
                and isinstance(row.get("completion"), str)):
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{path} row {number} has {keys}: in a prompt/completion file every row needs string "
                             "'prompt' and 'completion' (or give every row a 'text' instead)")
    return PromptCompletions(rows, tokenizer, block_size)


def mechanism_modules(model: nn.Module) -> list[str]:
    """Names of the mechanism modules that have parameters: value paths, depth routers and readout, KVM mixers
    (the modules that define `diagnostics()`)."""
    return [name for name, module in model.named_modules()
            if module is not model and callable(getattr(module, "diagnostics", None))
            and any(True for _ in module.parameters())]


def mechanism_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters of `mechanism_modules(model)`, by their names in `model`."""
    modules = mechanism_modules(model)
    return {name: parameter for name, parameter in model.named_parameters()
            if any(name.startswith(module + ".") for module in modules)}


def finetune(
    model_path: str,
    data: str,
    output_dir: str,
    lora: bool = False,
    lora_r: int = 16,
    lora_alpha: int | None = None,
    lora_dropout: float = 0.0,
    train_mechanism: bool | None = None,
    merge: bool = False,
    block_size: int = 512,
    **training_arguments,
) -> dict:
    """Fine-tune the model saved in `model_path` on `data`; returns the final metrics.

    Writes OUTPUT_DIR/final (the fine-tuned model, or the LoRA adapter) with the tokenizer and, with `merge`
    (LoRA only), OUTPUT_DIR/merged: the adapter merged into the weights, a checkpoint that loads with
    `trust_remote_code` and gives the adapter model's logits. `train_mechanism` None means True for full
    fine-tuning and False for LoRA. Rerunning with the same output directory resumes from its last checkpoint.
    """
    if merge and not lora:
        raise ValueError("--merge merges LoRA adapters into the weights; it needs --lora")
    if lora_r < 1:
        raise ValueError(f"--lora_r {lora_r} is invalid: expected an integer >= 1")
    config_path = Path(model_path) / "config.json"
    model_type = json.loads(config_path.read_text()).get("model_type") if config_path.is_file() else None
    if model_type not in MODEL_TYPES:
        raise ValueError(f"--model {model_path!r} is not an hf_valuearch checkpoint (config.json model_type "
                         f"{model_type!r}; expected one of {sorted(MODEL_TYPES)})")
    output = Path(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if is_prompt_completion_file(Path(data)):
        train_data, eval_data = prompt_completions(Path(data), tokenizer, block_size), None
    else:
        train_data = PackedStream(data, tokenizer, block_size, held_out=False)
        eval_data = HeldOutBlocks(PackedStream(data, tokenizer, block_size, held_out=True, max_blocks=64))

    args = TrainingArguments(output_dir=str(output), report_to=[], **training_arguments)
    set_seed(args.seed)
    model = MODEL_TYPES[model_type][2].from_pretrained(model_path)
    if isinstance(train_data, PromptCompletions):  # each example runs on its own tokens (KVM: padding split off)
        shortest = min(len(example["input_ids"]) for example in train_data.examples)
        source = f"the shortest example ({shortest} tokens, prompt + completion)"
    else:
        shortest, source = block_size, None
    args.ddp_find_unused_parameters, unused_note = find_unused_parameters(model.config, shortest,
                                                                          args.ddp_find_unused_parameters, source)
    if unused_note:
        print(unused_note)
    train_mechanism = (not lora) if train_mechanism is None else train_mechanism
    if lora:
        from peft import LoraConfig, get_peft_model

        # target_modules None: the defaults `import hf_valuearch` registered for every model type (q_proj, v_proj)
        lora_config = LoraConfig(task_type="CAUSAL_LM", r=lora_r, lora_alpha=lora_alpha or 2 * lora_r,
                                 lora_dropout=lora_dropout,
                                 modules_to_save=(mechanism_modules(model) or None) if train_mechanism else None)
        model = get_peft_model(model, lora_config)
    else:
        for parameter in mechanism_parameters(model).values():
            parameter.requires_grad_(train_mechanism)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    collator = PadToLongest(tokenizer.pad_token_id) if isinstance(train_data, PromptCompletions) else None
    # AdamW with a linear decay to 0, as Trainer's default; parameter groups as in pretraining
    trainer = AtomicCheckpointTrainer(model=model, args=args, train_dataset=train_data, eval_dataset=eval_data,
                                      data_collator=collator, recipe=OptimizerRecipe())
    last_checkpoint = get_last_checkpoint(str(output)) if output.is_dir() else None
    result = trainer.train(resume_from_checkpoint=last_checkpoint)
    metrics = {"train_loss": result.training_loss, "global_step": result.global_step, "trainable_parameters": trainable,
               "method": "lora" if lora else "full", "train_mechanism": train_mechanism, "base_model": str(model_path),
               "data": str(data), "resumed_from": last_checkpoint, **(trainer.evaluate() if eval_data else {})}

    def save(model_to_save, name: str, card: bool):
        """Write OUTPUT_DIR/name atomically: model (or adapter), tokenizer and, for full checkpoints, the card."""
        staging = output / f".staging-{name}"
        model_to_save.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if card:
            write_model_card(staging, record=metrics)
        replace_directory(staging, output / name)

    save(model, "final", card=not lora)  # an adapter folder carries PEFT's own README
    if merge:
        save(model.merge_and_unload(), "merged", card=True)
    return metrics
