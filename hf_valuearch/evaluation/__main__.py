"""`python -m hf_valuearch.evaluation --task-dir` prints the folder to pass to lm-eval's --include_path."""

import argparse

from . import TASK_DIR

parser = argparse.ArgumentParser(prog="python -m hf_valuearch.evaluation", description=__doc__)
parser.add_argument("--task-dir", action="store_true", help="print the lm-eval task folder (for --include_path)")
if parser.parse_args().task_dir:
    print(TASK_DIR)
else:
    parser.print_help()
