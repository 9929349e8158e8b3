"""Reproduce a paper's headline comparison at small scale: every model of the group trained on the same corpus,
tokenizer, data order, seeds and budget, then results.md / results.json / PNGs in OUTPUT_DIR/GROUP.

    python scripts/reproduce.py satformer --scale tiny --seeds 3 --output_dir reproduction

Groups: bov (BoV Table 1's 13 rows and BoV), satformer (baseline, ResFormer, SATFormer), rd_attnres (standard,
Block AttnRes, RD-AttnRes and its tied / average / frozen value-route controls), kvm (full attention, sliding
window, KVM fixed-256, KVM sqrt16), all. Scales: tiny (CPU minutes), small (about an hour for all groups with 2
seeds on 2 CPU cores), paper (the papers' configs and training recipes in configs/). Rerunning the same command resumes; finished runs have nothing to do.
`--core_data DIR` (DCLM CORE files) also scores every final model on CORE, finished runs included.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.reproduction import reproduce  # noqa: E402
from hf_valuearch.reproduction.groups import GROUPS, SCALES  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("group", choices=[*GROUPS, "all"])
    parser.add_argument("--corpus", default=None, help="local text / jsonl / parquet file or directory "
                                                       "(default: the embedded corpus)")
    parser.add_argument("--scale", choices=list(SCALES), default="tiny")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 (default 3)")
    parser.add_argument("--output_dir", default="reproduction")
    parser.add_argument("--core_data", default=None, help="folder of DCLM CORE files (llm-foundry's local_data "
                                                          "layout): also score every final model on CORE")
    parser.add_argument("--max_steps", type=int, default=None,
                        help="every run trains this many steps instead of its budget (smoke tests)")
    args = parser.parse_args(argv)
    if args.corpus is not None and args.corpus.startswith("hf:"):
        parser.error("--corpus takes local text; Hub datasets go through scripts/train.py --data hf:NAME")
    for group in GROUPS if args.group == "all" else [args.group]:
        try:
            reproduce(group, args.corpus, args.scale, args.seeds, args.output_dir, args.max_steps, args.core_data)
        except (ValueError, FileNotFoundError, RuntimeError) as error:
            sys.exit(f"error: {error}")
        print(f"{group}: {Path(args.output_dir) / group / 'results.md'}")


if __name__ == "__main__":
    main()
