"""Live diagnostics of every mechanism during training: TensorBoard, a CSV and, at the end, a PNG of the curves.

Every mechanism reports through `model.valuearch_diagnostics()` (value paths: BoV gamma and coefficients, SATFormer
gate mean / zero fraction per KV head; depth routers: mean depth distributions, Q/K-vs-V Jensen-Shannon divergence;
KVM mixers: state slots, window and state tokens, temperatures). `flatten_diagnostics` turns that report into
scalars named `<module>/<statistic>[/<index>]` and adds, per recorded depth route, its entropy (of the mean
distribution over tokens, in nats) and, per KVM layer, the state's coverage (tokens in the state / tokens seen).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

from transformers import TrainerCallback

from ..depth_routing import record_depth_routes

ROUTES = ("attention_qk", "attention_value", "mlp", "final")  # depth distributions recorded by the routers


def _short(module_name: str) -> str:
    return module_name.removeprefix("model.").replace(".self_attn", "")


def flatten_diagnostics(report: dict[str, dict]) -> dict[str, float]:
    """`model.valuearch_diagnostics()` as {"<module>/<statistic>[/<index>]": number}, plus route entropies and
    KVM state coverage."""
    scalars = {}
    for module_name, statistics in report.items():
        prefix = _short(module_name)
        for key, value in statistics.items():
            if isinstance(value, (list, tuple)):
                for index, item in enumerate(value):
                    scalars[f"{prefix}/{key}/{index}"] = float(item)
            else:
                scalars[f"{prefix}/{key}"] = float(value)
            if key in ROUTES:
                scalars[f"{prefix}/{key}_entropy"] = -sum(p * math.log(p) for p in value if p > 0)
        if "tokens_in_state" in statistics:
            seen = [s + w for s, w in zip(statistics["tokens_in_state"], statistics["window_tokens"])]
            coverage = [s / t for s, t in zip(statistics["tokens_in_state"], seen) if t > 0]
            if coverage:
                scalars[f"{prefix}/state_coverage"] = sum(coverage) / len(coverage)
    return scalars


class DiagnosticsCallback(TrainerCallback):
    """At every Trainer log: the logged losses (and eval bits per byte) plus `flatten_diagnostics(model)` go to
    TensorBoard (`OUTPUT_DIR/tensorboard`) and to `OUTPUT_DIR/diagnostics.csv` (columns step, name, value); at the
    end of training, `OUTPUT_DIR/diagnostics.png` plots them over steps. Main process only. Depth routes are
    recorded from the training forwards (`record_depth_routes`), so logging costs no extra forward."""

    def __init__(self, output_dir: str | Path):
        self.output_dir = Path(output_dir)
        self.writer = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        record_depth_routes(model, True)
        if state.is_world_process_zero:
            from torch.utils.tensorboard import SummaryWriter

            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(str(self.output_dir / "tensorboard"))

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if self.writer is None:
            return
        entries = {name: float(value) for name, value in logs.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
        if "loss" in logs:  # a training log: the mechanisms' state after the last training step
            entries.update({f"diagnostics/{name}": value
                            for name, value in flatten_diagnostics(model.valuearch_diagnostics()).items()})
        csv_path = self.output_dir / "diagnostics.csv"
        new_file = not csv_path.exists()
        with open(csv_path, "a", newline="") as file:
            writer = csv.writer(file)
            if new_file:
                writer.writerow(["step", "name", "value"])
            for name, value in entries.items():
                writer.writerow([state.global_step, name, value])
                self.writer.add_scalar(name, value, state.global_step)
        self.writer.flush()

    def on_train_end(self, args, state, control, model=None, **kwargs):
        record_depth_routes(model, False)
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            plot_diagnostics(self.output_dir / "diagnostics.csv", self.output_dir / "diagnostics.png")


def plot_diagnostics(csv_path: Path, png_path: Path, max_panels: int = 12):
    """One panel for the losses, one per diagnostic statistic (all layers / heads in it), from the CSV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    with open(csv_path) as file:
        for row in csv.DictReader(file):
            name = row["name"]
            if name in ("loss", "eval_loss", "eval_bpb"):
                panel = "bits per byte" if name == "eval_bpb" else "loss"
            elif name.startswith("diagnostics/"):
                parts = name.split("/")[1:]
                panel = parts[1] if len(parts) > 1 else parts[0]  # the statistic, over modules / indices
            else:
                continue
            series[panel][name].append((int(row["step"]), float(row["value"])))
    panels = sorted(series, key=lambda panel: panel not in ("loss", "bits per byte"))[:max_panels]
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.2 * rows), squeeze=False)
    for axis, panel in zip(axes.flat, panels):
        for name, points in series[panel].items():
            steps, values = zip(*points)
            axis.plot(steps, values, label=name.removeprefix("diagnostics/") if len(series[panel]) <= 6 else None)
        axis.set_title(panel)
        axis.set_xlabel("step")
        if len(series[panel]) <= 6:
            axis.legend(fontsize=6)
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
