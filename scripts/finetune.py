"""Fine-tune a saved hf_valuearch model (any model type) with transformers' Trainer: all weights or LoRA.

    python scripts/finetune.py --model runs/baseline/final --data DATA --output_dir runs/ft [--lora] [--lora_r 16] \
        [--merge] [--mechanism train|freeze]

DATA is a text file or directory (documents packed into blocks), or a .jsonl file with a "text" field per row, or
with "prompt" and "completion" (the loss on the completion only). OUTPUT_DIR/final receives the fine-tuned model
(or the LoRA adapter) and the tokenizer; with --lora --merge, OUTPUT_DIR/merged receives the merged checkpoint,
which loads with trust_remote_code like the original. Mechanism parameters (value tables, gates, pseudo-queries,
KVM gates) train with full fine-tuning and are frozen under LoRA unless --mechanism says otherwise.
Any other `--name value` pair is passed to `TrainingArguments` (e.g. --learning_rate 1e-4).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.training import parse_cli_value  # noqa: E402
from hf_valuearch.training.finetune import finetune  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint folder written by save_pretrained")
    parser.add_argument("--data", required=True, help="text file, directory, or .jsonl (text or prompt/completion)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    parser.add_argument("--lora_r", type=int, default=16)
    parser.add_argument("--lora_alpha", type=int, default=None, help="default: 2 * lora_r")
    parser.add_argument("--lora_dropout", type=float, default=0.0)
    parser.add_argument("--merge", action="store_true", help="also write OUTPUT_DIR/merged (needs --lora)")
    parser.add_argument("--mechanism", choices=["train", "freeze"], default=None,
                        help="mechanism parameters (default: train with full fine-tuning, freeze with LoRA)")
    parser.add_argument("--block_size", type=int, default=512, help="tokens per training sequence")
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--save_steps", type=int, default=50)
    args, extra = parser.parse_known_args(argv)
    if len(extra) % 2:
        parser.error(f"TrainingArguments must come as --name value pairs, got {extra}")
    training_arguments = {key.lstrip("-"): parse_cli_value(value) for key, value in zip(extra[::2], extra[1::2])}
    try:
        metrics = finetune(
            args.model, args.data, args.output_dir, lora=args.lora, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout, merge=args.merge, block_size=args.block_size,
            train_mechanism=None if args.mechanism is None else args.mechanism == "train",
            max_steps=args.max_steps, per_device_train_batch_size=args.per_device_train_batch_size,
            learning_rate=args.learning_rate, save_steps=args.save_steps,
            logging_steps=max(1, args.max_steps // 20), **training_arguments,
        )
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"finetune.py: error: {error}") from None
    print(json.dumps(metrics, indent=2, default=str))


if __name__ == "__main__":
    main()
