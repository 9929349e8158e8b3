"""results.md (the papers' table form), results.json and PNGs of a reproduced group."""

from __future__ import annotations

import json
from pathlib import Path

from .statistics import format_spread

STATISTIC_LABELS = {
    "value_scale": "γ (value scale)", "residual_scale": "α (on V)", "source_scale": "β (on the extra values)",
    "v1_gate_zero_fraction": "gate sparsity (fraction of ReLU gates exactly 0)",
    "qk_value_js": "Q/K-vs-V route Jensen-Shannon divergence (nats)", "state_slots": "KVM state slots",
}


def _difference(entry: dict, metric: str) -> str:
    diff = entry.get(f"{metric}_vs_baseline")
    if diff is None:
        return "—"
    per_seed = ", ".join(f"{value:+.4f}" for value in diff["per_seed"].values())
    return f"{format_spread(diff, signed=True)} ({per_seed})"


def _mean_layers(seeds: dict[int, dict], statistic: str) -> dict[int, float]:
    """Per layer, the mean over seeds of one diagnostic statistic."""
    per_layer: dict[int, list] = {}
    for run in seeds.values():
        for layer, value in run["layers"].get(statistic, {}).items():
            per_layer.setdefault(int(layer), []).append(value)
    return {layer: sum(values) / len(values) for layer, values in sorted(per_layer.items())}


def results_markdown(results: dict) -> str:
    baseline, summary = results["baseline"], results["summary"]
    with_core = all("core" in entry for entry in summary.values())
    lines = [
        f"# {results['paper']}: `{results['group']}` at `{results['scale']}` scale", "",
        f"Corpus: {results['corpus'] or 'the embedded default corpus'}; one BPE tokenizer of {results['vocab_size']} "
        f"tokens for the group; blocks of {results['block_size']} tokens, batch {results['batch_size']}, "
        f"seeds 0-{results['seeds'] - 1}; every model gets the same {results['matched']} as the baseline `{baseline}`.",
        "Values are mean ± sample standard deviation over seeds; differences are paired per seed (variant − baseline), "
        "per-seed values in brackets.", "",
        "| model | parameters (dense / table / routing) | tokens | FLOPs | val loss | bits per byte | "
        "Δ loss vs baseline | Δ bits per byte vs baseline |" + (" CORE | Δ CORE vs baseline |" if with_core else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if with_core else ""),
    ]
    for name, variant in results["variants"].items():
        seeds = results["runs"][name]
        parameters = " / ".join(f"{count:,}" for count in variant["parameters"].values())
        tokens = sum(run["tokens"] for run in seeds.values()) / len(seeds)
        flops = sum(run["flops"] for run in seeds.values()) / len(seeds)
        entry = summary[name]
        lines.append(f"| {name} | {parameters} | {tokens:.3g} | {flops:.3g} | {format_spread(entry.get('eval_loss'))} | "
                     f"{format_spread(entry.get('eval_bpb'))} | {_difference(entry, 'eval_loss')} | "
                     f"{_difference(entry, 'eval_bpb')} |"
                     + (f" {format_spread(entry['core'])} | {_difference(entry, 'core')} |" if with_core else ""))
    statistics = sorted({statistic for seeds in results["runs"].values() for run in seeds.values()
                         for statistic in run["layers"]})
    for statistic in statistics:
        rows = {name: _mean_layers(seeds, statistic) for name, seeds in results["runs"].items()}
        rows = {name: layers for name, layers in rows.items() if layers}
        layers = sorted({layer for values in rows.values() for layer in values})
        lines += ["", f"## {STATISTIC_LABELS.get(statistic, statistic)} per layer (mean over seeds, final model)", "",
                  "| model | " + " | ".join(f"layer {layer}" for layer in layers) + " |",
                  "|---|" + "---|" * len(layers)]
        for name, values in rows.items():
            lines.append(f"| {name} | " + " | ".join(f"{values[layer]:.4g}" if layer in values else "—"
                                                    for layer in layers) + " |")
    if "long_context" in results:
        lines += long_context_markdown(results)
    if results["notes"]:
        lines += ["", results["notes"]]
    if any(entry.get("eval_bpb") is None for entry in summary.values()):
        lines += ["", "Bits per byte: n/a where the training run did not report `eval_bpb`."]
    return "\n".join(lines) + "\n"


LONG_CONTEXT_TITLES = {
    "loss_by_length": "Held-out loss (nats / token) of the same last {block} tokens, from contexts of each length",
    "niah_by_length": "NIAH accuracy by context length (single needle, mean over depths {depths} %, {samples} samples "
                      "per depth)",
}


def long_context_markdown(results: dict) -> list[str]:
    """The long-context tables: loss by context length and NIAH accuracy, one row per model."""
    lines, niah = [], results.get("niah_setup", {})
    for metric, by_model in results["long_context"].items():
        lengths = sorted({length for by_length in by_model.values() for length in by_length})
        title = LONG_CONTEXT_TITLES[metric].format(block=results["block_size"], samples=niah.get("samples"),
                                                   depths="/".join(map(str, niah.get("depths", []))))
        lines += ["", f"## {title} (trained on {results['block_size']}; mean ± spread over seeds)", "",
                  "| model | " + " | ".join(f"{length}" for length in lengths) + " |", "|---|" + "---|" * len(lengths)]
        for name, by_length in by_model.items():
            lines.append(f"| {name} | " + " | ".join(format_spread(by_length[length]) if length in by_length else "—"
                                                     for length in lengths) + " |")
    return lines


def plot_long_context(results: dict, path: Path):
    """One panel per long-context metric over context length (held-out loss of the same tokens, NIAH accuracy),
    one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"loss_by_length": "held-out loss of the same tokens (nats / token)",
              "niah_by_length": "NIAH accuracy"}
    metrics = list(results["long_context"])
    figure, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        for name, by_length in results["long_context"][metric].items():
            axis.plot(list(by_length), [entry["mean"] for entry in by_length.values()], "o-", label=name)
        axis.axvline(results["block_size"], color="grey", linestyle=":", label="training length")
        axis.set_xscale("log", base=2)
        axis.set(xlabel="context length (tokens)", ylabel=labels[metric])
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_loss_curves(results: dict, path: Path):
    """Training loss over steps, mean over seeds, one line per model (held-out loss as markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, seeds in results["runs"].items():
        for kind, style in (("train", "-"), ("eval", "o")):
            curves = [dict(run["history"][kind]) for run in seeds.values()]
            steps = sorted(set.intersection(*(set(curve) for curve in curves)))
            if steps:
                means = [sum(curve[step] for curve in curves) / len(curves) for step in steps]
                axis.plot(steps, means, style, label=f"{name} ({'held-out' if kind == 'eval' else 'train'})")
    axis.set(xlabel="step", ylabel="loss (nats / token)", title=f"{results['group']}: loss, mean over seeds")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_layer_diagnostics(results: dict, path: Path) -> bool:
    """One panel per per-layer statistic, one line per model; False when the group has none."""
    statistics = sorted({statistic for seeds in results["runs"].values() for run in seeds.values()
                         for statistic in run["layers"]})
    if not statistics:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(statistics), figsize=(5.5 * len(statistics), 4), squeeze=False)
    for axis, statistic in zip(axes[0], statistics):
        for name, seeds in results["runs"].items():
            values = _mean_layers(seeds, statistic)
            if values:
                axis.plot(list(values), list(values.values()), "o-", label=name)
        axis.set(xlabel="layer", title=STATISTIC_LABELS.get(statistic, statistic))
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_report(results: dict, group_dir: Path):
    """results.json, results.md, loss_curves.png, layer_diagnostics.png (when the group has per-layer statistics) and
    long_context.png (when it measures beyond the training length)."""
    (group_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (group_dir / "results.md").write_text(results_markdown(results))
    plot_loss_curves(results, group_dir / "loss_curves.png")
    plot_layer_diagnostics(results, group_dir / "layer_diagnostics.png")
    if "long_context" in results:
        plot_long_context(results, group_dir / "long_context.png")
