"""DCLM CORE of a reproduced model, where the CORE data are given (`--core_data DIR`): the `core` suite of
`hf_valuearch.evaluation` over every CORE task whose file DIR holds (llm-foundry's local_data layout)."""

from __future__ import annotations

import json
from pathlib import Path

from ..evaluation.tasks.core_tasks import CORE_TASKS


def available_core_tasks(core_data: str) -> list[str]:
    """The CORE tasks whose file `core_data` holds; ValueError naming the folder when there are none."""
    tasks = [task for task, spec in CORE_TASKS.items() if (Path(core_data) / spec.path).is_file()]
    if not tasks:
        raise ValueError(f"--core_data {core_data} holds none of the CORE files (expected llm-foundry's "
                         f"scripts/eval/local_data layout, e.g. {CORE_TASKS['copa'].path})")
    return tasks


def core_score(model_dir: Path, output_dir: Path, core_data: str) -> float:
    """The model's CORE score (mean centred accuracy) over `available_core_tasks`; the suite's results.json and
    summary.md stay in `output_dir` (reused on a rerun)."""
    results_file = output_dir / "results.json"
    if results_file.is_file():
        return json.loads(results_file.read_text())["core_score"]
    from ..evaluation.suites import run_suite

    record = run_suite("core", str(model_dir), str(output_dir), data_dir=core_data,
                       tasks=available_core_tasks(core_data), overwrite=True)
    return record["core_score"]
