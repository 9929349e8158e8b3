"""Aggregation over seeds: mean and spread of a metric, and paired differences against the baseline.

The spread is the sample standard deviation over seeds (n - 1 in the denominator; None for a single seed).
Paired differences subtract the baseline's value of the same seed, as the RD-AttnRes paper reports its controls:
runs of one seed share initial-weight randomness and data order, so the difference removes most seed noise.
"""

from __future__ import annotations

import math


def mean_and_spread(values: list[float]) -> dict:
    """{"mean", "std" (sample standard deviation, None for one value), "n"} of `values`."""
    if not values:
        raise ValueError("mean_and_spread needs at least one value")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((value - mean) ** 2 for value in values) / (n - 1)) if n > 1 else None
    return {"mean": mean, "std": std, "n": n}


def paired_differences(values: dict[int, float], baseline: dict[int, float]) -> dict:
    """Per seed, `values[seed] - baseline[seed]`, and their mean and spread. Both must hold the same seeds."""
    if set(values) != set(baseline):
        raise ValueError(f"paired differences need the same seeds: got {sorted(values)} against the baseline's "
                         f"{sorted(baseline)}")
    per_seed = {seed: values[seed] - baseline[seed] for seed in sorted(values)}
    return {"per_seed": per_seed, **mean_and_spread(list(per_seed.values()))}


def format_spread(summary: dict | None, digits: int = 4, signed: bool = False) -> str:
    """"mean ± std" (or the mean alone for one seed; "n/a" when not measured)."""
    if summary is None:
        return "n/a"
    sign = "+" if signed else ""
    text = f"{summary['mean']:{sign}.{digits}f}"
    return text if summary["std"] is None else f"{text} ± {summary['std']:.{digits}f}"
