"""Side-by-side benchmarks: every number printed is a ratio of two models measured in this process.

    python scripts/bench.py SUITE [--threads N] [...]

Each suite builds the models it compares, warms them up, then times them in alternation
(A, B, A, B, ...) so that machine noise hits both sides alike, and prints medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

SUITES: dict[str, Callable[[argparse.Namespace], None]] = {}


def suite(name: str):
    """Register a benchmark suite under `name`."""

    def register(fn):
        SUITES[name] = fn
        return fn

    return register


def time_side_by_side(candidates: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1) -> dict[str, float]:
    """Median wall time in seconds of each zero-argument callable, measured in alternation."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=sorted(SUITES), help="which comparison to run")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per candidate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    SUITES[args.suite](args)


if __name__ == "__main__":
    main()
