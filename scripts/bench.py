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
    """Median wall time in seconds of each zero-argument callable, measured in alternation (A, B, C, then
    C, B, A, ...)."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for round_idx in range(repeats):
        order = list(candidates) if round_idx % 2 == 0 else list(reversed(candidates))  # no favoured position
        for name in order:
            start = time.perf_counter()
            candidates[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


# --- value paths (spec_value_paths.md) --------------------------------------------------------------------


@suite("value_paths")
def bench_value_paths(args):
    """Prefill and cached decode of each value-path preset against the standard decoder, same backbone."""
    from hf_valuearch import MODEL_TYPES
    from hf_valuearch.compat import output_cache

    backbone = dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=6,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024)
    variants = {"baseline": ("valuearch", {}), "bov": ("bov", {}), "resformer": ("resformer", {}),
                "satformer": ("satformer", {"qk_norm": "none", "tie_word_embeddings": False}),
                "x0_last_third": ("valuearch", {"value_source": "x0", "value_layers": "last_third",
                                                "value_coefficients": "learnable"})}
    models = {name: MODEL_TYPES[t][2](MODEL_TYPES[t][0](**backbone, **o)).eval() for name, (t, o) in variants.items()}
    prompt = torch.randint(0, backbone["vocab_size"], (4, 256))

    def prefill(model):
        return lambda: model(prompt, use_cache=False)

    def decode(model, steps=32):
        def run():
            cache = output_cache(model(prompt, use_cache=True))
            token = prompt[:, -1:]
            for _ in range(steps):
                cache = output_cache(model(token, cache=cache, use_cache=True))
        return run

    with torch.no_grad():
        for label, make in (("prefill B=4 T=256", prefill), ("prefill + 32 decode steps", decode)):
            times = time_side_by_side({name: make(model) for name, model in models.items()}, repeats=args.repeats)
            print(f"{label}: time ratio to baseline (median of {args.repeats})")
            for name, seconds in times.items():
                print(f"  {name:15s} {seconds / times['baseline']:.3f}")
        cache_sizes = {}
        for name, model in models.items():
            cache = output_cache(model(prompt, use_cache=True))
            cache_sizes[name] = sum(t.numel() * t.element_size() for l in cache.layers for t in (l.keys, l.values))
        print("generation cache bytes after 256 tokens, ratio to baseline")
        for name, size in cache_sizes.items():
            print(f"  {name:15s} {size / cache_sizes['baseline']:.3f}")


# ==================================================================================================
# KVM: prefill time and decode speed vs full attention (spec_kvm.md A.4, A.9)
# ==================================================================================================


def _kvm_bench_models(**kvm_fields):
    """Same small backbone (d 256, 4 heads x 64, 2 layers, partial RoPE, q/k LayerNorm), full attention vs KVM."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hf_valuearch import KvmConfig, KvmForCausalLM

    sizes = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, max_position_embeddings=32768, attn_implementation="sdpa")
    models = {"full": KvmForCausalLM(KvmConfig(**sizes, mixer_types=["full_attention"] * 2)).eval()}
    for name, fields in kvm_fields.items():
        models[name] = KvmForCausalLM(KvmConfig(**sizes, **fields)).eval()
    return models


KVM_BENCH_VARIANTS = {
    "kvm_fixed256": dict(kvm_chunk_size=256),  # the preset: fixed 256 slots
    "kvm_sqrt16": dict(kvm_chunk_size=256, kvm_state_schedule="power_law", kvm_state_max_chunks=10000),
}


@suite("kvm_prefill")
def kvm_prefill(args):
    """Prefill wall time (no cache, no gradients) of KVM vs full attention for T = 1k .. 16k tokens.

    On a shared machine use --threads 1: with 2 threads every op waits for a descheduled worker thread.
    """
    models = _kvm_bench_models(**KVM_BENCH_VARIANTS)
    print(f"threads={torch.get_num_threads()}  ratio = KVM time / full-attention time (< 1: KVM faster)")
    for length in (1024, 2048, 4096, 8192, 16384):
        ids = torch.randint(3, 256, (1, length))
        with torch.no_grad():
            times = time_side_by_side({name: (lambda m=model: m(ids, use_cache=False)) for name, model in models.items()},
                                      repeats=args.repeats)
        ratios = "  ".join(f"{name} {times[name] / times['full']:.2f}x" for name in models if name != "full")
        print(f"T={length:6d}  full {times['full']:.3f}s  {ratios}")


@suite("kvm_decode")
def kvm_decode(args):
    """Greedy decode tokens/s after a prefill of T tokens, KVM vs full attention (DynamicCache-style K/V)."""
    models = _kvm_bench_models(kvm_fixed256=KVM_BENCH_VARIANTS["kvm_fixed256"])
    from hf_valuearch.compat import output_cache
    steps = 16
    print(f"threads={torch.get_num_threads()}  {steps} decode steps per timing; ratio = KVM tokens/s / full tokens/s")
    for length in (1024, 4096, 16384):
        ids = torch.randint(3, 256, (1, length))
        caches = {}
        with torch.no_grad():
            for name, model in models.items():
                caches[name] = output_cache(model(ids, use_cache=True))

            def decode(name):
                token = torch.tensor([[7]])
                for _ in range(steps):
                    caches[name] = output_cache(models[name](token, cache=caches[name], use_cache=True))

            times = time_side_by_side({name: (lambda n=name: decode(n)) for name in models}, repeats=args.repeats)
        speed = {name: steps / t for name, t in times.items()}
        print(f"T={length:6d}  full {speed['full']:.1f} tok/s  kvm {speed['kvm_fixed256']:.1f} tok/s  "
              f"ratio {speed['kvm_fixed256'] / speed['full']:.2f}x")


# --- depth routing: Block AttnRes and RD-AttnRes (hf_valuearch/depth_routing.py) ----------------------


@suite("depth_routing")
def depth_routing_training_throughput(args):
    """Training tokens/s (forward, backward, AdamW step) of the standard decoder, Block AttnRes and
    RD-AttnRes (learned value route) on one backbone; prints attnres/standard and rd_attnres/attnres."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hf_valuearch import MODEL_TYPES

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # The paper's 120M backbone (configs/depth_routing/attnres_120m.json): width 576, 9 heads, SwiGLU 1536;
    # on CPU 8 of its 16 layers, a small vocabulary and short sequences keep one step near a few seconds.
    backbone = dict(vocab_size=50304 if device == "cuda" else 2048, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=16 if device == "cuda" else 8, num_attention_heads=9,
                    max_position_embeddings=1024, attnres_block_size=4)
    batch, length = (16, 1024) if device == "cuda" else (2, 256)
    input_ids = torch.randint(0, backbone["vocab_size"], (batch, length), device=device)

    def training_step(model_type, **fields):
        config = MODEL_TYPES[model_type][0](**{**backbone, **fields})
        model = MODEL_TYPES[model_type][2](config).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            model(input_ids, labels=input_ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()

        return step

    seconds = time_side_by_side(
        {"standard": training_step("valuearch", attnres_block_size=None), "attnres": training_step("attnres"),
         "rd_attnres": training_step("rd_attnres")},
        repeats=args.repeats,
    )
    print(f"device {device}, batch {batch} x {length} tokens, {backbone}")
    for name, value in seconds.items():
        print(f"{name:>10}: {batch * length / value:10.0f} training tokens/s")
    print(f"attnres / standard throughput:   {seconds['standard'] / seconds['attnres']:.3f}")
    print(f"rd_attnres / attnres throughput: {seconds['attnres'] / seconds['rd_attnres']:.3f}")


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
