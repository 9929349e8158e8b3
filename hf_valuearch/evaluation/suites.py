"""Run one suite (core, ruler, niah) through lm-eval and write results.json, summary.md and plots."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from . import TASK_DIR, summary as summaries
from .tasks.core_tasks import CORE_TASKS, read_items
from .tasks.ruler_tasks import NIAH_TASKS

RULER_TASKS = [*NIAH_TASKS, "vt", "cwe", "fwe", "qa_squad", "qa_hotpot"]
QA_FILES = {"qa_squad": "dev-v2.0.json", "qa_hotpot": "hotpot_dev_distractor_v1.json"}  # looked up in --data-dir
SUITES = {"core": list(CORE_TASKS), "ruler": RULER_TASKS, "niah": ["niah_grid"]}
LM_EVAL_PREFIX = {"core": "core_", "ruler": "ruler_offline_", "niah": ""}
DEFAULT_LENGTHS = {"ruler": [4096], "niah": [1024, 2048, 4096]}


def select_tasks(suite: str, tasks: list[str] | None, data_dir: str | None) -> list[str]:
    """The suite's task names to run, checked against what exists; ValueError / FileNotFoundError naming what is
    wrong (unknown suite or task, missing data files: all missing CORE files in one message)."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; expected one of {', '.join(SUITES)}")
    unknown = [task for task in tasks or [] if task not in SUITES[suite]]
    if unknown:
        raise ValueError(f"unknown {suite} task(s) {', '.join(unknown)}; expected names from: "
                         f"{', '.join(SUITES[suite])}")
    if suite == "core":
        if not data_dir:
            raise ValueError("--suite core needs --data-dir DIR holding the DCLM / llm-foundry ICL files "
                             "(llm-foundry's scripts/eval/local_data)")
        selected = tasks or SUITES["core"]
        missing = sorted({CORE_TASKS[task].path for task in selected
                          if not (Path(data_dir) / CORE_TASKS[task].path).is_file()})
        if missing:
            raise FileNotFoundError(f"--data-dir {data_dir} lacks {len(missing)} CORE file(s): {', '.join(missing)} "
                                    "(select available tasks with --tasks)")
        for task in selected:
            read_items(Path(data_dir) / CORE_TASKS[task].path, CORE_TASKS[task].kind)
        return selected
    if suite == "ruler":
        def qa_file(task):
            return Path(data_dir) / QA_FILES[task] if data_dir else None

        for task in tasks or []:
            if task in QA_FILES and not (qa_file(task) and qa_file(task).is_file()):
                raise FileNotFoundError(f"RULER task {task} reads {QA_FILES[task]} from --data-dir "
                                        f"(not found: {qa_file(task) or 'no --data-dir given'})")
        return tasks or [task for task in RULER_TASKS
                         if task not in QA_FILES or (qa_file(task) and qa_file(task).is_file())]
    return ["niah_grid"]


def check_model_dir(model: str) -> None:
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {model}: no such directory (expected a saved model, e.g. "
                                "runs/baseline/final)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {model} holds no config.json (expected a model saved with save_pretrained)")


def run_suite(suite: str, model: str, output: str, data_dir: str | None = None, tasks: list[str] | None = None,
              limit: int | None = None, lengths: list[int] | None = None, depths: list[int] | None = None,
              batch_size: int = 1, device: str = "cpu", dtype: str = "float32", haystack: str | None = None,
              overwrite: bool = False) -> dict:
    """Evaluate `model` (a saved model directory, loaded with trust_remote_code) on `suite` and write OUT/results.json
    ({"suite", "model", "lm_eval": lm-eval's results, "summary": {task: {metric: value}}, "core_score" for core}),
    OUT/summary.md and plots. `limit` caps examples per task (core), per length (ruler) or per grid cell (niah)."""
    check_model_dir(model)
    selected = select_tasks(suite, tasks, data_dir)
    if haystack and not Path(haystack).is_file():
        raise FileNotFoundError(f"--haystack {haystack}: no such file")
    if lengths and min(lengths) <= 0:
        raise ValueError(f"--lengths must be positive token counts, got {lengths}")
    if depths and not all(0 <= depth <= 100 for depth in depths):
        raise ValueError(f"--depths must be percentages in [0, 100], got {depths}")
    out = Path(output)
    existing = [name for name in ("results.json", "summary.md") if (out / name).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{output} already holds {', '.join(existing)}; pass --overwrite to replace them")

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lengths = lengths or DEFAULT_LENGTHS.get(suite)
    metadata = {"pretrained": str(model)}
    model_args = {"pretrained": str(model), "trust_remote_code": True, "dtype": dtype}
    if suite == "core":
        metadata["core_data_dir"] = str(Path(data_dir).resolve())
    else:
        metadata.update(max_seq_lengths=lengths, num_samples=limit, haystack_file=haystack, niah_depths=depths)
        model_args["max_length"] = max(lengths)
        if suite == "ruler" and data_dir:
            metadata.update({f"{task[3:]}_file": str(Path(data_dir) / name) for task, name in QA_FILES.items()})
    task_manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False, metadata=metadata)
    results = simple_evaluate(model="hf", model_args=model_args, tasks=[LM_EVAL_PREFIX[suite] + t for t in selected],
                              task_manager=task_manager, batch_size=batch_size, device=device,
                              limit=limit if suite == "core" else None, log_samples=False)
    task_results = {task: results["results"][LM_EVAL_PREFIX[suite] + task] for task in selected}

    record = {"suite": suite, "model": str(model), "lm_eval": results}
    title = f"# {suite} evaluation of `{model}`\n\n"
    setup = (f"lm-eval {results.get('lm_eval_version', '')}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"dtype {dtype}, limit {limit}" + (f", lengths {lengths}" if suite != "core" else "") + "\n\n")
    out.mkdir(parents=True, exist_ok=True)
    if suite == "core":
        record["summary"], record["core_score"] = summaries.core_summary(
            {task: entry["acc,none"] for task, entry in task_results.items()})
        body = summaries.core_markdown(record["summary"], record["core_score"])
    elif suite == "ruler":
        record["summary"] = {task: {**{str(length): value for length, value in summaries.length_scores(entry).items()},
                                    "acc": entry["acc,none"]} for task, entry in task_results.items()}
        summaries.plot_ruler(record["summary"], out / "ruler_accuracy_vs_length.png")
        body = (summaries.ruler_markdown(record["summary"])
                + "\n![RULER accuracy vs length](ruler_accuracy_vs_length.png)\n")
    else:
        grid = summaries.grid_scores(task_results["niah_grid"])
        record["summary"] = {"niah_grid": {**{f"{length}_depth{depth}": value for length, row in grid.items()
                                              for depth, value in row.items()},
                                           "acc": task_results["niah_grid"]["acc,none"]}}
        summaries.plot_niah(grid, out / "niah_heatmap.png")
        body = summaries.niah_markdown(grid) + "\n![NIAH heatmap](niah_heatmap.png)\n"
    write_atomically(out / "summary.md", title + setup + body)
    write_atomically(out / "results.json", json.dumps(record, indent=2, default=str))
    return record


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
