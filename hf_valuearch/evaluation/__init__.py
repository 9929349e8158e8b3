"""Evaluation through lm-eval: DCLM CORE, RULER generated offline and a NIAH length x depth grid.

The task YAMLs and their generators live in `tasks/` (print the folder with `python -m hf_valuearch.evaluation
--task-dir`, pass it to lm-eval's `--include_path`); they import nothing from hf_valuearch, so they also run
where only lm-eval and a `trust_remote_code` checkpoint are installed. `suites.py` runs a whole suite and
`summary.py` turns lm-eval's results into the summary, the CORE score, `summary.md` and plots
(`scripts/evaluate.py` is the command line).
"""

from pathlib import Path

TASK_DIR = Path(__file__).resolve().parent / "tasks"
