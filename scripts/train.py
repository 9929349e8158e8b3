"""Pretrain an hf_valuearch model (or the standard baseline) with transformers' Trainer.

    python scripts/train.py --config configs/valuearch/tiny.json --data CORPUS --output_dir runs/baseline \
        --max_steps 200

CORPUS is a text file, a directory of text files, or `hf:NAME[:CONFIG]` (a Hub dataset, streamed).
Without --tokenizer, a byte-level BPE of the config's vocab_size is trained on the corpus first.
Rerunning the same command resumes from the last complete checkpoint in --output_dir.
Any other `--name value` pair is passed to `TrainingArguments` (e.g. --learning_rate 3e-4).
`--push_to_hub true [--hub_model_id ORG/NAME]` uploads OUTPUT_DIR/final with its model card at the end; the Hub
access (token, network) is checked before training starts.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.cards.hub import HubUnavailable  # noqa: E402
from hf_valuearch.training import pretrain  # noqa: E402


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="config JSON file or model type (e.g. valuearch, bov)")
    parser.add_argument("--data", required=True, help="text file, directory, or hf:NAME[:CONFIG]")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--tokenizer", default=None, help="local tokenizer directory (default: train one)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a config field (VALUE parsed as JSON), repeatable")
    parser.add_argument("--block_size", type=int, default=256, help="tokens per training sequence")
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--save_steps", type=int, default=100)
    args, extra = parser.parse_known_args(argv)
    if len(extra) % 2:
        parser.error(f"TrainingArguments must come as --name value pairs, got {extra}")
    training_arguments = {key.lstrip("-"): parse_value(value) for key, value in zip(extra[::2], extra[1::2])}
    overrides = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects FIELD=VALUE, got {item!r}")
        overrides[field] = parse_value(value)
    try:
        metrics = pretrain(
            args.config, args.data, args.output_dir, tokenizer_path=args.tokenizer, overrides=overrides,
            block_size=args.block_size, max_steps=args.max_steps, learning_rate=args.learning_rate,
            per_device_train_batch_size=args.per_device_train_batch_size, save_steps=args.save_steps,
            logging_steps=max(1, args.max_steps // 20), **training_arguments,
        )
    except HubUnavailable as error:
        raise SystemExit(f"train.py: error: {error}") from None
    print(json.dumps(metrics, indent=2, default=str))


if __name__ == "__main__":
    main()
