"""Evaluate a saved model with lm-eval on one suite and write OUT/results.json, OUT/summary.md and plots.

    python scripts/evaluate.py --model runs/baseline/final --suite core --data-dir local_data --output eval/core
    python scripts/evaluate.py --model runs/baseline/final --suite ruler --lengths 1024 2048 --output eval/ruler
    python scripts/evaluate.py --model runs/baseline/final --suite niah --lengths 512 1024 2048 --output eval/niah

Suites: core (DCLM CORE, 22 tasks, from the llm-foundry ICL files in --data-dir), ruler (RULER generated offline;
the QA tasks run when --data-dir holds dev-v2.0.json / hotpot_dev_distractor_v1.json), niah (needle depth x
context length grid). The model loads with trust_remote_code from its own directory.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.evaluation.suites import SUITES, run_suite  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved model directory (weights, config, tokenizer)")
    parser.add_argument("--suite", required=True, help=f"one of {', '.join(SUITES)}")
    parser.add_argument("--output", required=True, help="output directory for results.json, summary.md, plots")
    parser.add_argument("--data-dir", help="core: llm-foundry's local_data folder; ruler: folder with QA files")
    parser.add_argument("--tasks", help="comma-separated task names of the suite (default: all)")
    parser.add_argument("--limit", type=int, help="examples per task (core), per length (ruler), per cell (niah)")
    parser.add_argument("--lengths", type=int, nargs="+", help="context lengths in tokens (ruler, niah)")
    parser.add_argument("--depths", type=int, nargs="+", help="needle depths in percent (niah; default 0 10 ... 100)")
    parser.add_argument("--haystack", help="text file for the essay haystacks (ruler, niah; default: embedded)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--overwrite", action="store_true", help="replace results already in --output")
    args = parser.parse_args(argv)
    try:
        record = run_suite(args.suite, args.model, args.output, data_dir=args.data_dir,
                           tasks=args.tasks.split(",") if args.tasks else None, limit=args.limit,
                           lengths=args.lengths, depths=args.depths, batch_size=args.batch_size,
                           device=args.device, dtype=args.dtype, haystack=args.haystack, overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        parser.exit(2, f"evaluate.py: error: {error}\n")
    print((Path(args.output) / "summary.md").read_text())
    if "core_score" in record:
        print(f"CORE score: {record['core_score']:.4f}")


if __name__ == "__main__":
    main()
