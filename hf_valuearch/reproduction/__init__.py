"""Small-scale reproduction of each paper's headline comparison (`scripts/reproduce.py`).

For a group (`groups.GROUPS`), every model gets the same corpus, one tokenizer trained once for the group, the same
data order (the packed stream is deterministic), the same seeds and the same budget: the baseline's tokens, or its
FLOPs where the paper matches FLOPs (`accounting.flops_per_token`). Each run is `hf_valuearch.training.pretrain`,
the code path of `scripts/train.py`, so rerunning the command resumes unfinished runs and finished runs have
nothing to do. After training, every final model runs a few held-out blocks with its depth routes recorded, and
`model.valuearch_diagnostics()` gives the per-layer statistics; the loss curves come from the Trainer's log history.
Groups about long context (`Group.loss_context_multiples`, `niah_context_multiples`) also measure held-out loss and
NIAH accuracy at multiples of the training length (`long_context.py`).
Not shipped inside checkpoints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint

from ..depth_routing import record_depth_routes
from ..training import TOKENIZER_SAMPLE_CHARS, load_config, pretrain, replace_directory, train_tokenizer
from ..training.accounting import flops_per_token, parameter_split
from ..training.data import HeldOutBlocks, PackedStream, training_texts
from .groups import GROUPS, REPO, SCALES, Group, Scale, Variant
from . import long_context
from .core_score import available_core_tasks, core_score
from .long_context import loss_by_length, niah_by_length
from .report import write_report
from .statistics import mean_and_spread, paired_differences

DIAGNOSTIC_BLOCKS = 4  # held-out blocks each final model runs to record its per-layer diagnostics


def source_config(group: Group, variant: Variant, scale: Scale) -> dict:
    """The variant's config fields at `scale`: its source file (the tiny one for "tiny" and "small") plus its own
    fields; a field set to None is removed (the model type's default applies)."""
    key = "paper" if scale.name == "paper" else "tiny"
    if key not in variant.config:
        raise ValueError(f"group {group.name!r} has no {scale.name}-scale config for {variant.name!r} in configs/; "
                         f"allowed scales for it: {['tiny', 'small'] if 'tiny' in variant.config else ['paper']}")
    source = json.loads((REPO / variant.config[key]).read_text())
    fields = dict(source)
    for name, value in variant.fields_for(source).items():
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = value
    return fields


def run_plan(group: Group, scale: Scale) -> tuple[int, int, dict]:
    """(block size, global batch in sequences, the baseline's budget: {"tokens": N} or {"flops": F}) at `scale`;
    "paper" reads them from the baseline config's "training" recipe (block_size, batch_sequences and its budget)."""
    if scale.name != "paper":
        return scale.block_size, scale.batch_size, {"tokens": scale.baseline_tokens}
    recipe = source_config(group, group.baseline, scale).get("training", {})
    block_size, batch_size = recipe.get("block_size"), recipe.get("batch_sequences")
    if recipe.get("flops"):
        budget = {"flops": float(recipe["flops"])}
    elif recipe.get("tokens") or recipe.get("max_steps"):
        budget = {"tokens": float(recipe.get("tokens") or recipe["max_steps"] * (batch_size or 0) * (block_size or 0))}
    else:
        budget = {}
    if not block_size or not batch_size or not budget:
        raise ValueError(f"--scale paper needs block_size, batch_sequences and one of flops / tokens / max_steps in "
                         f"the \"training\" recipe of {group.baseline.config['paper']}; it has {sorted(recipe)}")
    return block_size, batch_size, budget


def group_tokenizer(group_dir: Path, corpus: str | None, vocab_size: int):
    """The group's tokenizer, trained once on the corpus (`group_dir/tokenizer`, written atomically)."""
    path = group_dir / "tokenizer"
    if not path.is_dir():
        staging = group_dir / ".staging-tokenizer"
        train_tokenizer(training_texts(corpus, TOKENIZER_SAMPLE_CHARS), vocab_size).save_pretrained(staging)
        replace_directory(staging, path)
    return AutoTokenizer.from_pretrained(path)


def check_manifest(group_dir: Path, manifest: dict):
    """Refuse to mix runs of different corpora, scales or budgets in one output directory."""
    path = group_dir / "manifest.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved != manifest:
            changed = {key: (saved.get(key), manifest.get(key)) for key in manifest if saved.get(key) != manifest[key]}
            raise ValueError(f"{group_dir} holds runs of another setting ({changed}, as (saved, now)); rerun with the "
                             "same options to resume, or use a new --output_dir")
    else:
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps(manifest, indent=2))
        os.replace(staging, path)


def loss_history(run_dir: Path) -> dict[str, list]:
    """{"train": [(step, loss)], "eval": [(step, eval_loss)]} from the Trainer's log history of the last checkpoint."""
    checkpoint = get_last_checkpoint(str(run_dir))
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    history = {"train": [], "eval": []}
    for entry in state["log_history"]:
        if "loss" in entry:
            history["train"].append((entry["step"], entry["loss"]))
        if "eval_loss" in entry:
            history["eval"].append((entry["step"], entry["eval_loss"]))
    return history


@torch.no_grad()
def layer_diagnostics(model, blocks: torch.Tensor, statistics: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """{statistic: {layer: value}} from `model.valuearch_diagnostics()` after a forward on `blocks` with depth routes
    recorded; a statistic with several entries per layer (heads, sequences) is averaged."""
    model.eval()
    record_depth_routes(model, True)
    try:
        model(input_ids=blocks, use_cache=False)
        report = model.valuearch_diagnostics()
    finally:
        record_depth_routes(model, False)
    result = {}
    for module_name, values in report.items():
        parts = module_name.split(".")
        if "layers" not in parts:
            continue
        layer = int(parts[parts.index("layers") + 1])
        for statistic in statistics:
            if statistic in values:
                value = values[statistic]
                value = sum(value) / len(value) if isinstance(value, (list, tuple)) else value
                result.setdefault(statistic, {})[layer] = float(value)
    return result


def aggregate(runs: dict[str, dict[int, dict]], baseline: str) -> dict[str, dict]:
    """Per variant: mean ± spread over seeds of "eval_loss", "eval_bpb" and (where measured) "core", and paired
    differences per seed against `baseline`. `runs[variant][seed]` holds the run's metrics; a metric absent from any run is left out."""
    summary = {}
    for name, seeds in runs.items():
        entry = {}
        for metric in ("eval_loss", "eval_bpb", "core"):
            if not all(run.get(metric) is not None for run in [*seeds.values(), *runs[baseline].values()]):
                continue
            values = {seed: run[metric] for seed, run in seeds.items()}
            entry[metric] = mean_and_spread(list(values.values()))
            if name != baseline:
                entry[f"{metric}_vs_baseline"] = paired_differences(
                    values, {seed: run[metric] for seed, run in runs[baseline].items()})
        summary[name] = entry
    return summary


def long_context_summary(runs: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """{"loss_by_length" / "niah_by_length": {variant: {length: mean ± spread over seeds}}} for the metrics the runs
    hold; a length missing from any seed of a variant is left out for it."""
    summary = {}
    for metric in ("loss_by_length", "niah_by_length"):
        if not all(metric in run for seeds in runs.values() for run in seeds.values()):
            continue
        summary[metric] = {}
        for name, seeds in runs.items():
            lengths = set.intersection(*(set(run[metric]) for run in seeds.values()))
            summary[metric][name] = {length: mean_and_spread([run[metric][length] for run in seeds.values()])
                                     for length in sorted(lengths)}
    return summary


def reproduce(group_name: str, corpus: str | None = None, scale_name: str = "tiny", seeds: int = 3,
              output_dir: str = "reproduction", max_steps: int | None = None, core_data: str | None = None) -> dict:
    """Train every model of a group for every seed (resuming), then write results.md, results.json and the PNGs
    into `output_dir/group_name`; returns the results. With `core_data` (a folder of DCLM CORE files) every final
    model is also scored on CORE (finished runs too: the score can be added later)."""
    if group_name not in GROUPS:
        raise ValueError(f"unknown group {group_name!r}; allowed: {sorted(GROUPS)} or 'all'")
    if scale_name not in SCALES:
        raise ValueError(f"unknown scale {scale_name!r}; allowed: {sorted(SCALES)}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds {seeds!r} is invalid: expected an integer >= 1")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"--max_steps {max_steps!r} is invalid: expected an integer >= 1")
    if core_data is not None:
        available_core_tasks(core_data)  # a folder without CORE files fails before any training
    group, scale = GROUPS[group_name], SCALES[scale_name]
    group_dir = Path(output_dir) / group.name
    block_size, batch_size, baseline_budget = run_plan(group, scale)
    configs = {variant.name: source_config(group, variant, scale) for variant in group.variants}
    vocab_size = scale.vocab_size or configs[group.baseline.name]["vocab_size"]
    manifest = {"group": group.name, "corpus": corpus, "scale": scale.name, "seeds": seeds, "max_steps": max_steps,
                "vocab_size": vocab_size, "block_size": block_size, "batch_size": batch_size}
    group_dir.mkdir(parents=True, exist_ok=True)
    check_manifest(group_dir, manifest)
    tokenizer = group_tokenizer(group_dir, corpus, vocab_size)
    blocks = torch.stack(HeldOutBlocks(PackedStream(corpus, tokenizer, block_size, held_out=True,
                                                    max_blocks=DIAGNOSTIC_BLOCKS)).blocks)

    loss_lengths = [multiple * block_size for multiple in group.loss_context_multiples]
    niah_lengths = [multiple * block_size for multiple in group.niah_context_multiples]
    config_dir = group_dir / "configs"
    config_dir.mkdir(exist_ok=True)
    written = {}
    for name, fields in configs.items():
        fields["vocab_size"] = vocab_size
        fields["max_position_embeddings"] = max(fields.get("max_position_embeddings", 0), block_size, *loss_lengths,
                                                   *niah_lengths)
        written[name] = config_dir / f"{name}.json"
        written[name].write_text(json.dumps(fields, indent=2) + "\n")

    per_token = {name: flops_per_token(load_config(str(path)), block_size) for name, path in written.items()}
    baseline_per_token = per_token[group.baseline.name]
    budget_flops = baseline_budget.get("flops") or baseline_budget["tokens"] * baseline_per_token
    baseline_tokens = baseline_budget.get("tokens") or budget_flops / baseline_per_token
    runs, variants = {}, {}
    for variant in group.variants:
        name = variant.name
        if max_steps is not None:
            budget = {"max_steps": max_steps}
        elif group.flop_matched:
            budget = {"flops": budget_flops}
        else:
            budget = {"tokens": baseline_tokens}
        runs[name] = {}
        for seed in range(seeds):
            run_dir = group_dir / "runs" / name / f"seed{seed}"
            print(f"== {group.name} / {name} / seed {seed}: {run_dir}")
            metrics = pretrain_run(str(written[name]), corpus, run_dir, group_dir / "tokenizer", block_size,
                                   batch_size if scale.name != "paper" else None, seed, budget)
            model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
            tokens = metrics["global_step"] * batch_size * block_size
            runs[name][seed] = {
                "eval_loss": metrics.get("eval_loss"), "eval_bpb": metrics.get("eval_bpb"),
                "global_step": metrics["global_step"], "tokens": tokens, "flops": tokens * per_token[name],
                "history": loss_history(run_dir),
                "layers": layer_diagnostics(model, blocks, group.layer_statistics),
            }
            if loss_lengths:
                runs[name][seed]["loss_by_length"] = loss_by_length(model, corpus, tokenizer, block_size, loss_lengths)
            if core_data is not None:
                runs[name][seed]["core"] = core_score(run_dir / "final", run_dir / "core", core_data)
            if niah_lengths:
                runs[name][seed]["niah_by_length"] = niah_by_length(run_dir / "final", run_dir / "niah", niah_lengths)
        variants[name] = {"config": str(written[name].relative_to(group_dir)), "flops_per_token": per_token[name],
                          "parameters": parameter_split(model)}
    results = {
        **manifest, "paper": group.paper, "notes": group.notes, "baseline": group.baseline.name,
        "matched": (f"number of steps (--max_steps {max_steps}: a smoke run, budgets not matched)"
                    if max_steps is not None else "training FLOPs" if group.flop_matched else "training tokens"),
        "variants": variants, "runs": runs, "summary": aggregate(runs, group.baseline.name),
    }
    if loss_lengths or niah_lengths:
        results["long_context"] = long_context_summary(runs)
    if niah_lengths:
        results["niah_setup"] = {"depths": list(long_context.NIAH_DEPTHS), "samples": long_context.NIAH_SAMPLES}
    write_report(results, group_dir)
    return results


def pretrain_run(config: str, corpus, run_dir: Path, tokenizer: Path, block_size: int, batch_size: int | None,
                 seed: int, budget: dict) -> dict:
    """One run through `scripts/train.py`'s code path (resumes; a finished run has nothing to do). `batch_size`
    sequences make one step on one process; None keeps the config recipe's global batch (`batch_sequences`,
    accumulated over per-device batches, the paper scale)."""
    batch = {} if batch_size is None else {"per_device_train_batch_size": batch_size, "gradient_accumulation_steps": 1}
    return pretrain(config, corpus, str(run_dir), tokenizer_path=str(tokenizer), block_size=block_size, seed=seed,
                    disable_tqdm=True, **batch, **budget)
