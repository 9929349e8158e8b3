"""lm-eval results -> the summary ({task: {metric: value}}), the CORE score, `summary.md` and plots."""

from __future__ import annotations

from pathlib import Path

from .tasks.core_tasks import CORE_TASKS


def centered_accuracy(accuracy: float, random_baseline: float) -> float:
    """DCLM's centering: (acc - rb) / (1 - rb) with the random baseline rb given in percent."""
    baseline = 0.01 * random_baseline
    return (accuracy - baseline) / (1 - baseline)


def core_summary(accuracies: dict[str, float]) -> tuple[dict[str, dict[str, float]], float]:
    """({task: {"acc", "centered_acc"}}, CORE score = mean centered accuracy over the given CORE tasks)."""
    summary = {name: {"acc": accuracy, "centered_acc": centered_accuracy(accuracy, CORE_TASKS[name].random_baseline)}
               for name, accuracy in accuracies.items()}
    return summary, sum(entry["centered_acc"] for entry in summary.values()) / len(summary)


def length_scores(task_results: dict) -> dict[int, float]:
    """{length: accuracy} from one RULER / NIAH task's lm-eval results (metric names like "4096,none")."""
    return {int(key.split(",")[0]): value for key, value in task_results.items() if key.split(",")[0].isdigit()}


def grid_scores(task_results: dict) -> dict[int, dict[int, float]]:
    """{length: {depth: accuracy}} from the niah_grid task's lm-eval results (metric names "LENGTH_depthD,none")."""
    grid: dict[int, dict[int, float]] = {}
    for key, value in task_results.items():
        name = key.split(",")[0]
        if "_depth" in name and "stderr" not in name:
            length, depth = name.split("_depth")
            grid.setdefault(int(length), {})[int(depth)] = value
    return {length: dict(sorted(depths.items())) for length, depths in sorted(grid.items())}


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows])


def core_markdown(summary: dict, core_score: float) -> str:
    rows = [[name, CORE_TASKS[name].kind, CORE_TASKS[name].shots, entry["acc"], f"{CORE_TASKS[name].random_baseline:g}",
             entry["centered_acc"]] for name, entry in summary.items()]
    table = markdown_table(["task", "type", "shots", "accuracy", "random baseline (%)", "centered"], rows)
    scope = "all 22 tasks" if len(summary) == len(CORE_TASKS) else \
        f"{len(summary)} of 22 tasks, not comparable with published CORE scores"
    return f"{table}\n\n**CORE score** (mean centered accuracy, {scope}): **{core_score:.4f}**\n"


def ruler_markdown(summary: dict) -> str:
    lengths = sorted({int(key) for entry in summary.values() for key in entry if key.isdigit()})
    rows = [[task] + [entry.get(str(length), "") for length in lengths] for task, entry in summary.items()]
    means = [sum(entry[str(length)] for entry in summary.values() if str(length) in entry)
             / sum(str(length) in entry for entry in summary.values()) for length in lengths]
    return markdown_table(["task"] + [f"{length} tokens" for length in lengths], rows + [["**mean**"] + means]) + "\n"


def niah_markdown(grid: dict[int, dict[int, float]]) -> str:
    depths = sorted({depth for row in grid.values() for depth in row})
    rows = [[f"{length} tokens"] + [row.get(depth, "") for depth in depths] for length, row in grid.items()]
    return ("Exact-match accuracy (the needle's number appears in the answer); rows: context length, columns: needle "
            "depth.\n\n" + markdown_table(["length \\ depth"] + [f"{depth}%" for depth in depths], rows) + "\n")


def plot_ruler(summary: dict, path: Path) -> None:
    """Accuracy vs context length, one line per RULER task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for task, entry in summary.items():
        lengths = sorted(int(key) for key in entry if key.isdigit())
        axes.plot(lengths, [entry[str(length)] for length in lengths], marker="o", label=task)
    axes.set_xscale("log", base=2)
    axes.set(xlabel="context length (tokens)", ylabel="accuracy", ylim=(-0.02, 1.02), title="RULER accuracy vs length")
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_niah(grid: dict[int, dict[int, float]], path: Path) -> None:
    """Heatmap of NIAH accuracy: needle depth (x) by context length (y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = sorted({depth for row in grid.values() for depth in row})
    values = [[row.get(depth, float("nan")) for depth in depths] for row in grid.values()]
    figure, axes = plt.subplots(figsize=(1 + 0.6 * len(depths), 1 + 0.5 * len(grid)))
    image = axes.imshow(values, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    axes.set_xticks(range(len(depths)), [f"{depth}%" for depth in depths])
    axes.set_yticks(range(len(grid)), [str(length) for length in grid])
    axes.set(xlabel="needle depth", ylabel="context length (tokens)", title="NIAH accuracy")
    for row, line in enumerate(values):
        for column, value in enumerate(line):
            axes.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=7)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
