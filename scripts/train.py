"""Pretrain an hf_valuearch model (or the standard baseline) with transformers' Trainer.

    python scripts/train.py --config valuearch --output_dir runs/baseline --max_steps 200

--config is a config JSON file or a model type (meaning its tiny config, configs/tiny/TYPE.json).
--data is a text / jsonl / parquet file, a directory of them, or `hf:NAME[:CONFIG]` (a Hub dataset, streamed);
without it the run uses the embedded default corpus (Python's own documentation text; no network needed).
Without --tokenizer, a byte-level BPE of the config's vocab_size is trained on the corpus first.
Rerunning the same command resumes from the last complete checkpoint in --output_dir; Ctrl-C saves one.
Any other `--name value` pair is passed to `TrainingArguments` (e.g. --learning_rate 3e-4 --report_to
tensorboard), overriding the defaults below.
`--push_to_hub true [--hub_model_id ORG/NAME]` uploads OUTPUT_DIR/final with its model card at the end; the Hub
access (token, network) is checked before training starts.
"""

import argparse
import dataclasses
import difflib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import TrainingArguments  # noqa: E402

from hf_valuearch.training import parse_cli_value, pretrain  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="config JSON file or model type (e.g. valuearch, bov)")
    parser.add_argument("--data", default=None, help="text/jsonl/parquet file, directory, or hf:NAME[:CONFIG] "
                                                     "(default: the embedded corpus)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--tokenizer", default=None, help="local tokenizer directory (default: train one)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a config field (VALUE parsed as JSON), repeatable")
    parser.add_argument("--block_size", type=int, default=None,
                        help="tokens per training sequence (default: the preset's, else min(256, max positions))")
    budget = parser.add_argument_group("budget (one of them; default: the preset's, else 200 steps)")
    budget.add_argument("--max_steps", type=int, default=None)
    budget.add_argument("--tokens", type=float, default=None, help="training tokens, e.g. 2e9")
    budget.add_argument("--flops", type=float, default=None,
                        help="training FLOPs, e.g. 1.5e18 (6N without table lookups, plus attention)")
    optim = parser.add_argument_group("optimizer (default: the preset's recipe, else AdamW with linear decay)")
    optim.add_argument("--optimizer", choices=["adamw", "muon"], default=None,
                       help="muon: Muon for the layers' matrices, AdamW for the rest")
    optim.add_argument("--group_lr", action="append", default=[], metavar="GROUP=LR",
                       help="learning rate of one parameter group (matrices, embeddings, head, value_tables, "
                            "scalars, routing, gates, norms), repeatable")
    optim.add_argument("--warmdown_fraction", type=float, default=None, help="fraction of the steps spent decaying")
    optim.add_argument("--final_lr_fraction", type=float, default=None, help="lr at the end, as a fraction")
    optim.add_argument("--table_optimizer", default=None, help="optimizer of the BoV value tables")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model (TrainingArguments torch_compile=True); "
                             "`scripts/bench.py training --compile` measures compiled vs eager")
    args, extra = parser.parse_known_args(argv)
    if len(extra) % 2 or not all(key.startswith("--") for key in extra[::2]):
        parser.error(f"TrainingArguments must come as --name value pairs, got {extra}")
    known = {field.name for field in dataclasses.fields(TrainingArguments)}
    for key in extra[::2]:
        if key[2:] not in known:
            close = difflib.get_close_matches(key[2:], sorted(known), n=1)
            parser.error(f"{key} is neither an option of this script nor a TrainingArguments field"
                         + (f"; did you mean --{close[0]}?" if close else ""))
    overrides = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects FIELD=VALUE, got {item!r}")
        overrides[field] = parse_cli_value(value)
    training_arguments = {key[2:]: parse_cli_value(value) for key, value in zip(extra[::2], extra[1::2])}
    if args.compile:
        training_arguments["torch_compile"] = True
    optimizer = {name: getattr(args, name) for name in ("optimizer", "warmdown_fraction", "final_lr_fraction",
                                                        "table_optimizer") if getattr(args, name) is not None}
    if "warmup_steps" in training_arguments:  # the recipe's schedule runs the warmup
        optimizer["warmup_steps"] = training_arguments.pop("warmup_steps")
    for item in args.group_lr:
        group, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--group_lr expects GROUP=LR, got {item!r}")
        optimizer.setdefault("lr", {})[group] = float(value)
    try:
        metrics = pretrain(args.config, args.data, args.output_dir, tokenizer_path=args.tokenizer,
                           overrides=overrides, block_size=args.block_size, max_steps=args.max_steps,
                           tokens=args.tokens, flops=args.flops, optimizer=optimizer, **training_arguments)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        sys.exit(f"error: {error}")
    if int(os.environ.get("RANK", "0")) == 0:  # the main process of a multi-process run
        print(json.dumps(metrics, indent=2, default=str))


if __name__ == "__main__":
    main()
