"""Side-by-side benchmarks against transformers' LlamaForCausalLM of the same dimensions.

    python scripts/bench.py [SUITE ...] [--quick] [--output OUT.json] [--threads N] [--device cpu|cuda] [--compile]
                            [--clock wall|cpu]

Suites (all of them when none is named):
  training    training tokens/s (forward + backward + AdamW step) of every model type
  inference   prefill latency and cached decode tokens/s at 1k / 4k / 16k tokens of context
  memory      peak memory of a training step and of generation; generation-cache bytes per token, measured
              against the formula `cache_valuearch.cache_bytes_per_token`
  kvm         KVM layer prefill vs full SDPA attention at 1k-16k; decode tokens/s vs context; lm-eval-style
              left-padded generation, batch 8 vs batch 1

Every suite builds the models it compares in this process, warms them up, then times them in alternation
(A, B, C, then C, B, A, ...) so that machine noise hits all of them alike; it prints a markdown table of the
medians and of their ratios to Llama (and to the parent architecture, where one exists), then the targets of
issue 13 with their measured ratios. `--output` writes the raw medians and every ratio as JSON. `--quick` uses
small sizes (a few minutes on 2 CPU cores); on CUDA the models run in bfloat16. `--profile` adds the top
operators by share of self time (torch.profiler) for every training candidate: the first place to look when a
ratio is off. `--compile` adds a torch.compile'd copy of each training candidate, "NAME (compiled)", whose ratio
to parent is compiled / eager. `--clock cpu` times with this process's CPU time instead of wall time, so that
other processes on a shared machine barely move the ratios (with `--threads 1`, where CPU time is compute time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hf_valuearch import MODEL_TYPES  # noqa: E402
from hf_valuearch.cache_valuearch import cache_bytes_per_token  # noqa: E402
from hf_valuearch.compat import output_cache  # noqa: E402

SUITES: dict[str, Callable[[argparse.Namespace], list[dict]]] = {}
FULL, KVM = "full attention", "kvm fixed-256"  # the two candidates of the kvm suite
LAZY_BOV = "bov, lazy_adamw tables"  # BoV with table_optimizer="lazy_adamw" (training suite)
# the architecture each candidate modifies (its ratio "to parent"); the standard decoder's parent is Llama
PARENTS = {"bov": "valuearch", "resformer": "valuearch", "satformer": "valuearch", "attnres": "valuearch",
           "rd_attnres": "attnres", "kvm": "valuearch", KVM: FULL, LAZY_BOV: "bov"}
COMPILED = " (compiled)"  # suffix of a torch.compile'd training candidate; its parent is the eager candidate
# The issue-13 measurement backbone: d256, 6 layers, vocab 8192, 4 heads of 64.
BACKBONE = dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=32768)


def suite(name: str):
    """Register a benchmark suite: a function (args) -> list of result rows."""

    def register(fn):
        SUITES[name] = fn
        return fn

    return register


def time_side_by_side(candidates: dict[str, Callable[[], object]], args, repeats: int | None = None,
                      warmup: int = 1, min_seconds: float = 1.0, max_rounds: int = 51) -> dict[str, float]:
    """Median time in seconds of each zero-argument callable, measured in alternation (A, B, C, then
    C, B, A, ...), on the clock `args.clock`: wall time, or this process's CPU time ("cpu": the time other
    processes take on a shared machine is not counted). `args.repeats` rounds unless `repeats` says otherwise,
    and more for fast callables: enough for about `min_seconds` of the slowest one (at most `max_rounds`)."""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    slowest = 0.0
    for fn in candidates.values():
        for _ in range(warmup):
            start = clock()
            fn()
            slowest = max(slowest, clock() - start)
    rounds = max(repeats or args.repeats, min(max_rounds, int(min_seconds / max(slowest, 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for round_idx in range(rounds):
        order = list(candidates) if round_idx % 2 == 0 else list(reversed(candidates))  # no favoured position
        for name in order:
            synchronize(args.device)
            start = clock()
            candidates[name]()
            synchronize(args.device)
            samples[name].append(clock() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def synchronize(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def op_shares(fn: Callable[[], object], top: int = 8) -> list[tuple[str, float]]:
    """The `top` operators by share of self CPU time (plus self CUDA time on GPU) over one call of `fn`."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        fn()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [(e.key, e.self_cpu_time_total / total) for e in ranked]


# --- models ------------------------------------------------------------------------------------------------


def build_model(name: str, args, **dims):
    """`name` is a model type or "llama" (transformers' LlamaForCausalLM of the same dimensions)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    if name == "llama":
        model = LlamaForCausalLM(LlamaConfig(**dims, tie_word_embeddings=False, attn_implementation="sdpa"))
    else:
        config_class, _, model_class = MODEL_TYPES[name]
        model = model_class(config_class(**dims, attn_implementation="sdpa"))
    return model.to(device=args.device, dtype=args.dtype)


def candidates_of(args) -> list[str]:
    return ["llama", *MODEL_TYPES]


def row(suite_name: str, candidate: str, metric: str, value: float, unit: str, higher_is_better: bool,
        **extra) -> dict:
    return dict(suite=suite_name, candidate=candidate, metric=metric, value=value, unit=unit,
                higher_is_better=higher_is_better, **extra)


def parent_of(candidate: str) -> str:
    """The candidate a ratio "to parent" compares with: the architecture it modifies, or, for a compiled
    candidate, the same model in eager mode."""
    if candidate.endswith(COMPILED):
        return candidate.removesuffix(COMPILED)
    return PARENTS.get(candidate, "llama")


def add_ratios(rows: list[dict]) -> list[dict]:
    """Per metric: ratio to Llama and to the parent, both as speed/size ratios where higher is better
    (time ratios are inverted: a ratio of 1.1 means 10% faster or smaller)."""
    by_key = {(r["metric"], r["candidate"]): r for r in rows}

    def ratio(r, other):
        reference = by_key.get((r["metric"], other))
        if reference is None or reference is r or reference["value"] == 0 or r["value"] == 0:
            return None
        return r["value"] / reference["value"] if r["higher_is_better"] else reference["value"] / r["value"]

    for r in rows:
        if r["unit"] == "x":  # already a ratio (measured / formula, batch 8 / batch 1)
            r["ratio_to_llama"] = r["ratio_to_parent"] = None
            continue
        r["ratio_to_llama"] = ratio(r, "llama")
        r["ratio_to_parent"] = ratio(r, parent_of(r["candidate"])) if r["candidate"] != "llama" else None
    return rows


# --- suites ------------------------------------------------------------------------------------------------


@suite("training")
def bench_training(args) -> list[dict]:
    """Training tokens/s: forward, backward and AdamW step on one batch, every model type and Llama."""
    batch, length = (16, 1024) if args.device == "cuda" else (4, 256)
    ids = torch.randint(3, BACKBONE["vocab_size"], (batch, length), device=args.device)
    steps, models = {}, {}
    for name in candidates_of(args):
        models[name] = build_model(name, args, **BACKBONE).train()
        steps[name] = training_step(models[name], ids, args.device)
    models[LAZY_BOV] = build_model("bov", args, **BACKBONE).train()
    steps[LAZY_BOV] = training_step(models[LAZY_BOV], ids, args.device, lazy_tables=True)
    if args.compile:
        for name in candidates_of(args):
            compiled = torch.compile(models[name])
            try:
                training_step(compiled, ids, args.device)()
                steps[name + COMPILED] = training_step(compiled, ids, args.device)
            except Exception as error:  # reported, not fatal: compile support differs per model type
                print(f"torch.compile {name}: unsupported ({type(error).__name__}: {str(error).splitlines()[0]})")
    seconds = time_side_by_side(steps, args)
    # a compiled candidate's ratio to parent is compiled / eager of the same model
    rows = [row("training", name, f"training tokens/s (B{batch}x{length})", batch * length / s, "tokens/s", True)
            for name, s in seconds.items()]
    if args.profile:
        for name, step in steps.items():
            print(f"\nop shares, training step of {name}:")
            for op, share in op_shares(step):
                print(f"  {share:6.1%}  {op}")
    return rows


def training_step(model, ids, device, lazy_tables: bool = False):
    """One AdamW step on `ids`; with `lazy_tables`, BoV's value tables take `LazyRowAdamW` (only the batch's rows)."""
    from hf_valuearch.training.optim import CombinedOptimizer, LazyRowAdamW

    tables = [p for name, p in model.named_parameters() if lazy_tables and name.endswith("value_table.weight")]
    others = [p for p in model.parameters() if all(p is not table for table in tables)]
    optimizer = torch.optim.AdamW(others, lr=1e-4)
    if tables:
        optimizer = CombinedOptimizer([optimizer, LazyRowAdamW(tables, lr=1e-4)])

    def step():
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


@suite("inference")
def bench_inference(args) -> list[dict]:
    """Prefill latency (logits of the last token only) and cached greedy decode tokens/s after it."""
    contexts = (512, 1024) if args.quick else (1024, 4096, 16384)
    decode_steps = 8 if args.quick else 16
    models = {name: build_model(name, args, **BACKBONE).eval() for name in candidates_of(args)}
    rows = []
    for context in contexts:
        ids = torch.randint(3, BACKBONE["vocab_size"], (1, context), device=args.device)
        with torch.no_grad():
            prefill = time_side_by_side(
                {name: (lambda m=m: m(ids, use_cache=True, logits_to_keep=1)) for name, m in models.items()}, args)
            caches = {name: output_cache(m(ids, use_cache=True, logits_to_keep=1)) for name, m in models.items()}
            token = ids[:, -1:]

            def decode(name):
                for _ in range(decode_steps):
                    caches[name] = output_cache(models[name](token, cache=caches[name], use_cache=True))

            decode_time = time_side_by_side({name: (lambda n=name: decode(n)) for name in models}, args)
        for name in models:
            rows.append(row("inference", name, f"prefill s ({context} tokens)", prefill[name], "s", False))
            rows.append(row("inference", name, f"decode tokens/s ({context} context)",
                            decode_steps / decode_time[name], "tokens/s", True))
    return rows


@suite("memory")
def bench_memory(args) -> list[dict]:
    """Peak memory of a training step and of generation (each model in a fresh process), and generation-cache
    bytes per token: measured on a real cache and from `cache_bytes_per_token`."""
    rows = []
    context = 512 if args.quick else 2048
    for name in candidates_of(args):
        peaks = json.loads(subprocess.run(
            [sys.executable, __file__, "--memory-child", name, "--device", args.device, "--seed", str(args.seed),
             *(["--quick"] if args.quick else []), *(["--threads", str(args.threads)] if args.threads else [])],
            check=True, capture_output=True, text=True, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
        ).stdout.strip().splitlines()[-1])
        rows.append(row("memory", name, "peak training MiB", peaks["training"] / 2**20, "MiB", False))
        rows.append(row("memory", name, f"peak generation MiB ({context} + 16 tokens)",
                        peaks["generation"] / 2**20, "MiB", False))
    ids = torch.randint(3, BACKBONE["vocab_size"], (1, context), device=args.device)
    for name in candidates_of(args):
        model = build_model(name, args, **BACKBONE).eval()
        with torch.no_grad():
            cache = output_cache(model(ids, use_cache=True, logits_to_keep=1))
        measured = (cache.nbytes() if name != "llama"
                    else sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)))
        rows.append(row("memory", name, f"cache bytes/token ({context} tokens)", measured / context, "B", False))
        if name != "llama":
            formula = cache_bytes_per_token(model.config, args.dtype, context_length=context)
            rows.append(row("memory", name, "cache bytes measured / formula", measured / context / formula, "x",
                            True))
    return rows


def memory_child(args) -> dict:
    """Run in a fresh process: peak bytes above the process's footprint after imports, of generation (prefill +
    16 decode steps, model included) and of training (two AdamW steps, model and optimizer state included).

    CPU: the peak resident set (VmHWM, reset through /proc/self/clear_refs) with glibc's mmap threshold fixed
    at 64 KiB so freed tensors leave the resident set; CUDA: torch.cuda.max_memory_allocated."""

    def reset():
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            Path("/proc/self/clear_refs").write_text("5")

    def peak() -> int:
        if args.device == "cuda":
            return torch.cuda.max_memory_allocated()
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) * 1024

    context = 512 if args.quick else 2048
    baseline = torch.cuda.memory_allocated() if args.device == "cuda" else (reset(), peak())[1]
    reset()
    model = build_model(args.memory_child, args, **BACKBONE).eval()
    with torch.no_grad():
        ids = torch.randint(3, BACKBONE["vocab_size"], (1, context), device=args.device)
        cache = output_cache(model(ids, use_cache=True, logits_to_keep=1))
        for _ in range(16):
            cache = output_cache(model(ids[:, -1:], cache=cache, use_cache=True))
    del cache
    generation = peak() - baseline
    reset()
    ids = torch.randint(3, BACKBONE["vocab_size"], (4, 128 if args.quick else 256), device=args.device)
    step = training_step(model.train(), ids, args.device)
    step()
    step()
    return {"generation": generation, "training": peak() - baseline}


@suite("kvm")
def bench_kvm(args) -> list[dict]:
    """KVM (fixed 256-slot state, chunk 256) against full attention of the same backbone."""
    return kvm_layer_prefill(args) + kvm_model_prefill(args) + kvm_decode(args) + kvm_padded_batches(args)


def kvm_backbone(num_layers: int = 2) -> dict:
    """The KVM preset's attention (q/k LayerNorm, partial RoPE) on a d256, 4 x 64 heads backbone."""
    return dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=num_layers,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32768, pad_token_id=0)


def kvm_pair(args) -> dict:
    """{FULL: the KVM preset with full-attention layers, KVM: the KVM preset}."""
    from hf_valuearch import KvmConfig, KvmForCausalLM

    models = {}
    for name, mixer in ((FULL, "full_attention"), (KVM, "kvm")):
        torch.manual_seed(args.seed)
        config = KvmConfig(**kvm_backbone(), mixer_types=[mixer] * 2, attn_implementation="sdpa")
        models[name] = KvmForCausalLM(config).to(device=args.device, dtype=args.dtype).eval()
    return models


def kvm_layer_prefill(args) -> list[dict]:
    """One attention layer's sequence mixing, no cache: the KVM mixer vs causal SDPA on the same q, k, v."""
    from hf_valuearch import KvmConfig
    from hf_valuearch.kvm import KVMMixer

    config = KvmConfig(**kvm_backbone(1))
    mixer = KVMMixer(config, 0).to(device=args.device, dtype=args.dtype).eval()
    rows = []
    for length in (1024, 4096, 16384):
        q, k, v = (torch.randn(1, 4, length, 64, device=args.device, dtype=args.dtype) for _ in range(3))
        x = torch.randn(1, length, 256, device=args.device, dtype=args.dtype)
        with torch.no_grad():
            times = time_side_by_side({
                FULL: lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                KVM: lambda: mixer(q, k, v, x),
            }, args)
        for name, seconds in times.items():
            rows.append(row("kvm", name, f"layer prefill s ({length} tokens)", seconds, "s", False))
    return rows


def kvm_model_prefill(args) -> list[dict]:
    """Prefill of the 2-layer models (projections and MLPs included), no cache."""
    models = kvm_pair(args)
    rows = []
    for length in (1024, 4096) if args.quick else (1024, 4096, 16384):
        ids = torch.randint(3, 256, (1, length), device=args.device)
        with torch.no_grad():
            times = time_side_by_side({name: (lambda m=m: m(ids, logits_to_keep=1)) for name, m in models.items()},
                                      args)
        for name, seconds in times.items():
            rows.append(row("kvm", name, f"2-layer model prefill s ({length} tokens)", seconds, "s", False))
    return rows


def kvm_decode(args) -> list[dict]:
    """Greedy decode tokens/s after a prefill of T tokens, KVM vs full attention (2-layer models)."""
    models = kvm_pair(args)
    steps, rows = 16, []
    for length in (1024, 4096, 16384):
        ids = torch.randint(3, 256, (1, length), device=args.device)
        token = ids[:, -1:]
        with torch.no_grad():
            caches = {name: output_cache(m(ids, use_cache=True, logits_to_keep=1)) for name, m in models.items()}

            def decode(name):
                for _ in range(steps):
                    caches[name] = output_cache(models[name](token, cache=caches[name], use_cache=True))

            times = time_side_by_side({name: (lambda n=name: decode(n)) for name in models}, args)
        for name, seconds in times.items():
            rows.append(row("kvm", name, f"decode tokens/s ({length} context)", steps / seconds, "tokens/s", True))
    return rows


def kvm_padded_batches(args) -> list[dict]:
    """lm-eval generate_until: 8 prompts of different lengths, left-padded into one batch with an attention
    mask, vs the same 8 prompts one at a time; generated tokens/s of both, and their ratio."""
    models = kvm_pair(args)
    longest, new_tokens = (512, 8) if args.quick else (2048, 32)
    generator = torch.Generator().manual_seed(args.seed)
    lengths = torch.linspace(longest // 2, longest, 8).long().tolist()
    prompts = [torch.randint(3, 256, (n,), generator=generator) for n in lengths]
    ids = torch.zeros(8, longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for index, prompt in enumerate(prompts):
        ids[index, longest - len(prompt):], mask[index, longest - len(prompt):] = prompt, 1
    ids, mask = ids.to(args.device), mask.to(args.device)
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

    def batched(model):
        return lambda: model.generate(ids, attention_mask=mask, **options)

    def one_at_a_time(model):
        return lambda: [model.generate(p[None].to(args.device), **options) for p in prompts]

    candidates = {}
    for name, model in models.items():
        candidates[f"{name} batch 8"], candidates[f"{name} batch 1"] = batched(model), one_at_a_time(model)
    with torch.no_grad():
        times = time_side_by_side(candidates, args, repeats=max(2, args.repeats // 2))
    rows = []
    for name in models:
        tokens = 8 * new_tokens
        rows.append(row("kvm", name, f"left-padded generate tokens/s, batch 8 ({longest} max prompt)",
                        tokens / times[f"{name} batch 8"], "tokens/s", True))
        rows.append(row("kvm", name, f"left-padded generate tokens/s, batch 1 ({longest} max prompt)",
                        tokens / times[f"{name} batch 1"], "tokens/s", True))
        rows.append(row("kvm", name, "batch 8 / batch 1 throughput",
                        times[f"{name} batch 1"] / times[f"{name} batch 8"], "x", True))
    return rows


# --- targets (issue 13) ------------------------------------------------------------------------------------


def targets(rows: list[dict]) -> list[dict]:
    """Each target of issue 13 with its measured ratio (None when its suite did not run)."""
    values = {(r["suite"], r["metric"], r["candidate"]): r["value"] for r in rows}

    def find(prefix, candidate, suite_name=None):
        """The first measured value whose metric starts with `prefix` (e.g. at the smallest context)."""
        return next((v for (suite_name_, metric, name), v in values.items()
                     if metric.startswith(prefix) and name == candidate and suite_name in (None, suite_name_)), None)

    def speed_ratio(prefix, candidate, reference, suite_name=None):
        a, b = find(prefix, candidate, suite_name), find(prefix, reference, suite_name)
        return None if a is None or b is None else a / b

    def kvm_prefill_speedup(length, what="layer"):
        return speed_ratio(f"{what} prefill s ({length} tokens)", FULL, KVM, "kvm")  # time ratio: full / kvm

    decode_1k, decode_16k = (find(f"decode tokens/s ({n} context)", KVM, "kvm") for n in (1024, 16384))
    decode_16k_over_1k = None if None in (decode_1k, decode_16k) else decode_16k / decode_1k
    checks = [
        ("standard / Llama training tokens/s", speed_ratio("training tokens/s", "valuearch", "llama"), 0.95),
        ("standard / Llama decode tokens/s", speed_ratio("decode tokens/s", "valuearch", "llama"), 0.95),
        ("BoV / standard training tokens/s", speed_ratio("training tokens/s", "bov", "valuearch"), 1.0),
        ("BoV with lazy_adamw tables / standard training tokens/s",
         speed_ratio("training tokens/s", LAZY_BOV, "valuearch"), 1.0),
        ("ResFormer / standard training tokens/s", speed_ratio("training tokens/s", "resformer", "valuearch"), 0.95),
        ("SATFormer / standard training tokens/s", speed_ratio("training tokens/s", "satformer", "valuearch"), 0.95),
        ("Block AttnRes / standard training tokens/s", speed_ratio("training tokens/s", "attnres", "valuearch"),
         0.90),
        ("RD-AttnRes / Block AttnRes training tokens/s", speed_ratio("training tokens/s", "rd_attnres", "attnres"),
         0.97),
        ("KVM layer prefill speed-up over full attention, 16k", kvm_prefill_speedup(16384), 4.0),
        ("KVM layer prefill speed-up over full attention, 1k", kvm_prefill_speedup(1024), 1 / 1.05),
        ("KVM 2-layer model prefill speed-up over full attention, 1k", kvm_prefill_speedup(1024, "2-layer model"),
         1 / 1.05),
        ("KVM decode tokens/s, 16k / 1k context", decode_16k_over_1k, 0.9),
    ]
    results = [dict(target=name, ratio=ratio, needed=f">= {bound:.3g}", met=None if ratio is None else ratio >= bound)
               for name, ratio, bound in checks]
    bov_bytes = values.get(("memory", "cache bytes measured / formula", "bov"))
    results.append(dict(target="BoV cache bytes, measured / formula", ratio=bov_bytes, needed="= 1",
                        met=None if bov_bytes is None else bov_bytes == 1.0))
    return results


def markdown(rows: list[dict], target_rows: list[dict]) -> str:
    def fmt(x):
        return "" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| suite | metric | model | median | ratio to Llama | ratio to parent |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['suite']} | {r['metric']} | {r['candidate']} | {fmt(r['value'])} {r['unit']} | "
                     f"{fmt(r['ratio_to_llama'])} | {fmt(r['ratio_to_parent'])} |")
    if target_rows:
        lines += ["", "| target | measured ratio | needed | met |", "|---|---|---|---|"]
    for t in target_rows:
        met = "" if t["met"] is None else "yes" if t["met"] else "**no**"
        lines.append(f"| {t['target']} | {fmt(t['ratio'])} | {t['needed']} | {met} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"any of {sorted(SUITES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a few minutes on 2 CPU cores")
    parser.add_argument("--output", default=None, help="write the medians and ratios as JSON to this file")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per candidate (default 5, quick 3); fast calls get more")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or this process's CPU time (all its threads): other processes on a shared "
                             "machine do not count; use it with --threads 1 on CPU")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd training candidates")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler op shares of training steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)  # internal: one memory measurement
    args = parser.parse_args(argv)
    unknown = [name for name in args.suites if name not in SUITES]
    if unknown:
        parser.exit(2, f"bench.py: error: unknown suite(s) {unknown}; available: {sorted(SUITES)}\n")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "bench.py: error: --device cuda, but torch sees no CUDA device\n")
    if args.clock == "cpu" and args.device == "cuda":
        parser.exit(2, "bench.py: error: --clock cpu measures host CPU time, not GPU time; use --clock wall with cuda\n")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    args.repeats = args.repeats or (3 if args.quick else 5)
    if args.memory_child:
        print(json.dumps(memory_child(args)))
        return
    torch.manual_seed(args.seed)
    rows = []
    for name in args.suites or list(SUITES):
        started = time.perf_counter()
        suite_rows = add_ratios(SUITES[name](args))
        print(f"suite {name}: {time.perf_counter() - started:.0f} s\n{markdown(suite_rows, [])}\n", flush=True)
        rows += suite_rows
    target_rows = targets(rows)
    print(f"\ndevice {args.device} ({args.dtype}), threads {torch.get_num_threads()}, "
          f"{'quick' if args.quick else 'full'} sizes, median of {args.repeats} or more alternating rounds "
          f"(fast calls: about 1 s of the slowest, at most 51 rounds) of {args.clock} time\n")
    print(markdown(rows, target_rows))
    if args.output:
        settings = dict(device=args.device, dtype=str(args.dtype), threads=torch.get_num_threads(), quick=args.quick,
                        repeats=args.repeats, clock=args.clock, compile=args.compile, torch=torch.__version__)
        Path(args.output).write_text(json.dumps(dict(settings=settings, results=rows, targets=target_rows), indent=1))


if __name__ == "__main__":
    main()
