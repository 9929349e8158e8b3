"""Pretraining with transformers' Trainer: corpus -> tokenizer -> packed blocks -> model -> checkpoints.

Used by `scripts/train.py`. Not shipped inside checkpoints (remote code never imports it).

* Data (`data.py`): the embedded default corpus, local text / jsonl / parquet files or folders, or
  `hf:NAME[:CONFIG]`, all streamed through `datasets` and packed into blocks with EOS between documents.
* Tokenizer: a local tokenizer directory, or a byte-level BPE trained on a sample of the corpus itself.
* Checkpoints are written atomically (staged in `.staging/`, then renamed into place by the main process), the
  final model too; SIGINT / SIGTERM save a checkpoint and stop; a run restarted with the same output directory
  resumes from its last complete checkpoint, and a finished run has nothing to do.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import shutil
import signal
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, IntervalStrategy, get_last_checkpoint, rotate_checkpoints

from .. import MODEL_TYPES
from ..cards import write_model_card
from ..cards.hub import check_hub_access, upload_checkpoint
from .accounting import flops_per_token, parameter_split, shortest_block_training_every_parameter
from .data import DEFAULT_CORPUS, HeldOutBlocks, PackedStream, training_texts
from .diagnostics import DiagnosticsCallback
from .optim import OptimizerRecipe, build_optimizer

REPO = Path(__file__).resolve().parents[2]
# TrainingArguments' Hub options, handled here: the access check runs before any work, and the final folder is
# uploaded with its model card (Trainer's own push would fail late, after a long traceback, with a blank card).
HUB_ARGUMENTS = ("push_to_hub", "hub_model_id", "hub_token", "hub_private_repo", "hub_revision")
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2: the configs' pad/bos/eos defaults
TOKENIZER_SAMPLE_CHARS = 20_000_000  # the BPE is trained on at most this many characters of the corpus
TOKENIZER_RECORD = "valuearch_tokenizer.json"  # which corpus and vocabulary size a saved tokenizer was trained for
RUN_LOSS = "run_loss.json"  # in every checkpoint: the summed training loss of the whole run so far
TINY_CONFIGS = REPO / "configs" / "tiny"  # `--config TYPE` means TINY_CONFIGS/TYPE.json: trains on CPU in a minute


def parse_cli_value(text: str):
    """A command-line value as JSON where it parses (numbers, booleans, lists), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def check_config_fields(config_class, fields: dict, source: str):
    """Refuse a field `config_class` does not define, naming the closest valid one."""
    valid = {f.name for f in dataclasses.fields(config_class)}
    for name in fields:
        if name not in valid:
            close = difflib.get_close_matches(name, sorted(valid), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid fields: {sorted(valid)}"
            raise ValueError(f"{source} sets {name!r}, which {config_class.__name__} does not define{hint}")


RECIPE_KEYS = {"optimizer", "block_size", "batch_sequences", "max_steps", "tokens", "flops", "training_arguments", "data"}


def read_config_file(spec: str) -> tuple[dict, dict]:
    """(config fields, training recipe) of a JSON config file or a model type (its tiny config). A paper preset's
    file carries its training recipe under "training": "optimizer" (`OptimizerRecipe` fields), "block_size",
    "batch_sequences" (the global batch), one budget ("max_steps", "tokens" or "flops"), "training_arguments"
    (e.g. per_device_train_batch_size) and "data" (the corpus the paper used, for the record)."""
    path = Path(spec)
    if spec in MODEL_TYPES:
        path = TINY_CONFIGS / f"{spec}.json"
    elif path.suffix != ".json":
        raise ValueError(f"--config {spec!r} is neither a .json file nor a model type; model types: {sorted(MODEL_TYPES)}")
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    fields = json.loads(path.read_text())
    training = fields.pop("training", {})
    unknown = set(training) - RECIPE_KEYS
    if unknown:
        raise ValueError(f"{path}: \"training\" has unknown keys {sorted(unknown)}; allowed: {sorted(RECIPE_KEYS)}")
    return fields, training


def load_config(spec: str, overrides: dict | None = None):
    """A config from a JSON file (its `model_type` picks the class) or a model type (its tiny config), plus
    overrides (which must be fields of the config class)."""
    fields, _ = read_config_file(spec)
    model_type = fields.pop("model_type", "valuearch")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} in {spec!r} is unknown; allowed: {sorted(MODEL_TYPES)}")
    config_class = MODEL_TYPES[model_type][0]
    check_config_fields(config_class, overrides or {}, "--set")
    return config_class(**{**fields, **(overrides or {})})


def train_tokenizer(texts, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of `vocab_size` entries trained on `texts`; ids 0-2 are pad/bos/eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def resolve_tokenizer(tokenizer_path: str | None, output: Path, data: str | None, vocab_size: int):
    """The run's tokenizer: `--tokenizer`, else the one this output directory trained (when it was trained for
    the same corpus and vocabulary size), else a new BPE trained on the corpus (validated first)."""
    if tokenizer_path:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    else:
        record = {"data": data, "vocab_size": vocab_size}
        saved = output / "tokenizer"
        if (saved / TOKENIZER_RECORD).is_file():
            saved_record = json.loads((saved / TOKENIZER_RECORD).read_text())
            if saved_record != record:
                raise ValueError(f"{saved} was trained for {saved_record}, not for this run's {record}; use a new "
                                 "--output_dir, or pass --tokenizer to reuse that tokenizer")
            tokenizer = AutoTokenizer.from_pretrained(saved)
        else:
            tokenizer = train_tokenizer(training_texts(data, TOKENIZER_SAMPLE_CHARS), vocab_size)
            staging = output / ".staging-tokenizer"
            tokenizer.save_pretrained(staging)
            (staging / TOKENIZER_RECORD).write_text(json.dumps(record))
            shutil.rmtree(saved, ignore_errors=True)
            os.replace(staging, saved)
    if len(tokenizer) > vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the config's vocab_size={vocab_size}; "
                         f"use --set vocab_size={len(tokenizer)} or a smaller tokenizer")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token (needed between packed documents); set its eos_token")
    return tokenizer


def replace_directory(staging: Path, target: Path):
    """Put a completely written `staging` folder at `target`, replacing what was there, without a moment where
    `target` holds a partial folder."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)


class StopOnSignal(TrainerCallback):
    """SIGINT / SIGTERM end training after the current step with a checkpoint (saved by the Trainer)."""

    def __init__(self):
        self.received: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_train_end(self, args, state, control, **kwargs):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        self.received = signum

    def on_step_end(self, args, state, control, **kwargs):
        if self.received is not None:
            control.should_save = True
            control.should_training_stop = True


class AtomicCheckpointTrainer(Trainer):
    """A Trainer whose checkpoints appear only when complete: every process writes its part into `.staging/`;
    after a barrier the main process alone renames it into place. Each checkpoint also records the whole run's
    summed training loss so far (`run_loss.json`), so a resumed run reports the whole run's mean."""

    def __init__(self, *args, recipe: OptimizerRecipe, **kwargs):
        super().__init__(*args, **kwargs)
        self.recipe = recipe
        self.loss_before_resume = 0.0

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer, groups = build_optimizer(self.model, self.recipe, self.args.learning_rate,
                                                     self.args.weight_decay)
            if self.args.should_save:
                print(f"optimizer: {self.recipe.optimizer}\n{groups}")
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer or self.optimizer, lambda step: self.recipe.lr_multiplier(step, num_training_steps))
        return self.lr_scheduler

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        record = Path(resume_from_checkpoint) / RUN_LOSS
        if record.is_file():
            self.loss_before_resume = json.loads(record.read_text())["loss_sum"]

    def _issue_warnings_after_load(self, load_result):
        # A tied model's checkpoint omits the head (it is the embedding): not a missing key.
        tied = set(self.model._tied_weights_keys or {}) if self.model.config.tie_word_embeddings else set()
        missing = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def run_loss_sum(self) -> float:
        """The training loss summed over every step of the run so far, before a resume included."""
        return self.loss_before_resume + self._total_loss_scalar + float(self._tr_loss)

    def log(self, logs: dict, *args, **kwargs):
        if "eval_loss" in logs:  # bits per byte of the held-out text: nats/token / ln 2 * tokens/byte
            logs["eval_bpb"] = logs["eval_loss"] / math.log(2) * self.eval_dataset.tokens_per_byte
        super().log(logs, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        run_dir = self._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = os.path.join(run_dir, ".staging")
        if self.args.should_save:
            shutil.rmtree(staging_root, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        output_dir = self.args.output_dir
        self.args.output_dir = staging_root  # Trainer writes `<output_dir>/checkpoint-N`
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = output_dir
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            staged = Path(staging_root) / name
            (staged / RUN_LOSS).write_text(json.dumps({"loss_sum": self.run_loss_sum()}))
            replace_directory(staged, Path(run_dir) / name)
            shutil.rmtree(staging_root, ignore_errors=True)
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=False)
        self.accelerator.wait_for_everyone()


def finished_metrics(output: Path, max_steps: int) -> dict | None:
    """The metrics of a finished run in `output` that trained at least `max_steps` steps, else None."""
    record = output / "final" / "training_metrics.json"
    if record.is_file():
        metrics = json.loads(record.read_text())
        if metrics.get("global_step", 0) >= max_steps:
            return metrics
    return None


SCRIPT_DEFAULTS = {"per_device_train_batch_size": 8, "learning_rate": 1e-3, "save_steps": 100, "report_to": []}


def plan_steps(config, args, block_size: int, max_steps, tokens, flops) -> tuple[int, str]:
    """Training steps from one budget (--max_steps, --tokens or --flops; FLOPs per token as the papers count
    them, accounting.py), and a summary line of the budget."""
    given = {name: value for name, value in (("--max_steps", max_steps), ("--tokens", tokens), ("--flops", flops))
             if value is not None}
    if len(given) > 1:
        raise ValueError(f"give one budget, not {' and '.join(given)}")
    tokens_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size * block_size
    per_token = flops_per_token(config, block_size)
    if flops is not None:
        tokens = flops / per_token
    if tokens is not None:
        if not tokens >= tokens_per_step:
            raise ValueError(f"the budget of {tokens:.4g} tokens ({next(iter(given))} {next(iter(given.values()))}) is "
                             f"smaller than one step of {tokens_per_step} tokens; allowed: at least one step")
        max_steps = math.ceil(tokens / tokens_per_step)
    max_steps = 200 if max_steps is None else max_steps
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"--max_steps {max_steps!r} is invalid: expected an integer >= 1")
    total = max_steps * tokens_per_step
    return max_steps, (f"budget: {max_steps} steps x {tokens_per_step} tokens = {total:.4g} tokens x "
                       f"{per_token:.4g} FLOPs/token = {total * per_token:.4g} FLOPs")


def find_unused_parameters(config, length: int, requested: bool | None,
                           source: str | None = None) -> tuple[bool | None, str | None]:
    """DDP's `find_unused_parameters` for training `config` on sequences of at least `length` tokens, and a note to
    print; `source` says where that length comes from (default: "--block_size LENGTH").

    A sequence too short for every parameter to get a gradient (KVM's state key norm and merge gate, see
    `shortest_block_training_every_parameter`) needs the search, else DDP fails on the first step; `requested`
    (--ddp_find_unused_parameters; None: the Trainer's default) is kept otherwise, and refused if False."""
    shortest = shortest_block_training_every_parameter(config)
    if shortest is None or length >= shortest:
        return requested, None
    source = source or f"--block_size {length}"
    if requested is False:
        raise ValueError(f"{source} leaves KVM's state key norm / merge gate without gradients (they need sequences "
                         f"of at least {shortest} tokens), which DDP with --ddp_find_unused_parameters false cannot "
                         f"train; train on sequences of {shortest} tokens or more, or leave "
                         "--ddp_find_unused_parameters unset")
    return True, (f"note: {source} is shorter than the {shortest} tokens every KVM parameter needs for a gradient; "
                  "multi-process runs search for unused parameters (ddp_find_unused_parameters=True)")


def pretrain(
    config_spec: str,
    data: str | None,
    output_dir: str,
    tokenizer_path: str | None = None,
    overrides: dict | None = None,
    block_size: int | None = None,
    max_steps: int | None = None,
    tokens: float | None = None,
    flops: float | None = None,
    optimizer: dict | None = None,
    eval_blocks: int = 64,
    **training_arguments,
) -> dict:
    """Pretrain a model from scratch and save it with its tokenizer; returns the final metrics.

    Settings come from the command line, else the config file's "training" recipe, else the script's defaults:
    `optimizer` holds `OptimizerRecipe` fields; one budget of max_steps / tokens / flops sets the steps.
    With `push_to_hub=True` the final folder is uploaded to `hub_model_id` (default: the output directory's name);
    the Hub must be reachable with a token before training starts (else `HubUnavailable`)."""
    output = Path(output_dir)
    hub = {key: training_arguments.pop(key) for key in HUB_ARGUMENTS if key in training_arguments}
    if hub.get("push_to_hub"):
        hub["hub_token"] = check_hub_access(hub.get("hub_token"))
    config = load_config(config_spec, overrides)  # a bad config fails before any work
    _, preset = read_config_file(config_spec)
    try:
        recipe = OptimizerRecipe(**{**preset.get("optimizer", {}), **(optimizer or {})})
    except TypeError as error:
        raise ValueError(f"optimizer recipe: {error}; fields: {[f.name for f in dataclasses.fields(OptimizerRecipe)]}"
                         ) from None
    if block_size is None:
        block_size = preset.get("block_size", min(256, config.max_position_embeddings))
    if not isinstance(block_size, int) or not 2 <= block_size <= config.max_position_embeddings:
        raise ValueError(f"--block_size {block_size!r} is invalid: expected an integer in [2, "
                         f"max_position_embeddings={config.max_position_embeddings}] (or raise it with "
                         f"--set max_position_embeddings={block_size})")
    if max_steps is None and tokens is None and flops is None:
        max_steps, tokens, flops = (preset.get(name) for name in ("max_steps", "tokens", "flops"))
    arguments = {**SCRIPT_DEFAULTS, **preset.get("training_arguments", {}), **training_arguments}
    args = TrainingArguments(output_dir=str(output), **arguments)
    if "batch_sequences" in preset and "gradient_accumulation_steps" not in training_arguments:
        # the preset's global batch, whatever the number of processes: accumulate the rest
        per_step = args.per_device_train_batch_size * args.world_size
        if preset["batch_sequences"] % per_step:
            raise ValueError(f"the preset's batch of {preset['batch_sequences']} sequences is not a multiple of "
                             f"per_device_train_batch_size x processes = {per_step}; change "
                             "--per_device_train_batch_size or pass --gradient_accumulation_steps")
        args.gradient_accumulation_steps = preset["batch_sequences"] // per_step
    args.max_steps, budget = plan_steps(config, args, block_size, max_steps, tokens, flops)
    args.ddp_find_unused_parameters, unused_note = find_unused_parameters(config, block_size,
                                                                          args.ddp_find_unused_parameters)
    if "logging_steps" not in arguments:
        args.logging_steps = max(1, args.max_steps // 20)
    if "eval_strategy" not in arguments:  # held-out loss and bits per byte ten times per run
        args.eval_strategy, args.eval_steps = IntervalStrategy.STEPS, max(1, args.max_steps // 10)
    done = finished_metrics(output, args.max_steps)
    if done is not None:
        print(f"nothing to do: {output / 'final'} already holds this run, trained for {done['global_step']} steps "
              f"(--max_steps {args.max_steps}); raise --max_steps to train further")
        return {**done, "nothing_to_do": True}

    with args.main_process_first(desc="tokenizer"):
        tokenizer = resolve_tokenizer(tokenizer_path, output, data, config.vocab_size)
    config = load_config(config_spec, {
        "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id, **(overrides or {}),
    })
    eval_data = HeldOutBlocks(PackedStream(data, tokenizer, block_size, held_out=True, max_blocks=eval_blocks))
    train_data = PackedStream(data, tokenizer, block_size, held_out=False)

    set_seed(args.seed)  # the initial weights are part of the run: same seed, same model
    model = MODEL_TYPES[config.model_type][2](config)
    if args.should_save:
        if unused_note:
            print(unused_note)
        if "data" in preset and data != preset["data"]:
            print(f"note: the paper trained this preset on {preset['data']} (pass --data {preset['data']})")
        split = ", ".join(f"{kind} {count:,}" for kind, count in parameter_split(model).items())
        print(f"model: {config.model_type}, parameters: {split}\n{budget}\n"
              f"data: {DEFAULT_CORPUS if data is None else data}; {len(eval_data)} held-out blocks of {block_size} tokens")
    stop = StopOnSignal()
    trainer = AtomicCheckpointTrainer(model=model, args=args, train_dataset=train_data, eval_dataset=eval_data,
                                      callbacks=[stop, DiagnosticsCallback(output)], recipe=recipe)
    last_checkpoint = get_last_checkpoint(str(output)) if output.is_dir() else None
    result = trainer.train(resume_from_checkpoint=last_checkpoint)
    if stop.received is not None:
        name = signal.Signals(stop.received).name
        print(f"stopped by {name} at step {trainer.state.global_step}: checkpoint saved in {output}; rerun the same "
              "command to resume")
        raise SystemExit(128 + stop.received)
    steps_this_run = trainer.state.global_step - trainer._initial_global_step
    train_loss = (trainer.loss_before_resume + result.training_loss * steps_this_run) / trainer.state.global_step
    metrics = {"train_loss": train_loss, "global_step": result.global_step,
               "resumed_from": last_checkpoint, **trainer.evaluate()}
    final, staging = output / "final", output / ".staging-final"
    trainer.save_model(str(staging))
    if args.should_save:
        tokenizer.save_pretrained(staging)
        write_model_card(staging, record=metrics)
        replace_directory(staging, final)
        print(f"final model and tokenizer: {final}")
        if hub.get("push_to_hub"):
            metrics["hub_commit"] = upload_checkpoint(final, hub.get("hub_model_id") or output.resolve().name,
                                                      private=hub.get("hub_private_repo"),
                                                      revision=hub.get("hub_revision"), token=hub["hub_token"])
    trainer.accelerator.wait_for_everyone()
    return metrics
