"""scripts/reproduce.py: every group end to end at a micro scale, FLOP matching, resuming, and the aggregation over
seeds (means, spreads, paired differences) on given numbers."""

import dataclasses
import json
import math
import random

import pytest

from hf_valuearch import MODEL_TYPES
from hf_valuearch.evaluation.tasks.core_tasks import CORE_TASKS
from hf_valuearch.reproduction import aggregate, long_context, reproduce, run_plan, source_config
from hf_valuearch.reproduction.groups import GROUPS, SCALES
from hf_valuearch.reproduction.statistics import format_spread, mean_and_spread, paired_differences
from hf_valuearch.training import train_tokenizer
from hf_valuearch.training.data import training_texts
from tests.common import TINY, run_script, tiny_model

WORDS = "the a value bank layer token attention residual depth state window query key mean sum of in to".split()
MECHANISM = {"bov": ("bov", "value_scale"), "satformer": ("satformer", "v1_gate_zero_fraction"),
             "rd_attnres": ("rd_attnres", "qk_value_js"), "kvm": ("kvm_sqrt16", "state_slots")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(0)
    paragraphs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(4)) for _ in range(150)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(paragraphs))
    return str(path)


@pytest.fixture(scope="module")
def core_data(tmp_path_factory):
    """Two CORE tasks in llm-foundry's layout: copa (multiple choice) and winogrande (schema), random sentences."""
    rng = random.Random(1)

    def sentence(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    root = tmp_path_factory.mktemp("core_data")
    rows = {"copa": [{"query": sentence(6), "choices": [sentence(3), sentence(2)], "gold": rng.randrange(2)}
                     for _ in range(4)],
            "winogrande": [{"context_options": [sentence(4), sentence(5)], "continuation": sentence(3),
                            "gold": rng.randrange(2)} for _ in range(4)]}
    for task, items in rows.items():
        path = root / CORE_TASKS[task].path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(json.dumps(item) for item in items) + "\n")
    return str(root)


def test_mean_and_spread_of_given_numbers():
    assert mean_and_spread([1.0, 2.0, 3.0]) == {"mean": 2.0, "std": 1.0, "n": 3}  # sample std: n - 1
    assert mean_and_spread([4.0]) == {"mean": 4.0, "std": None, "n": 1}
    assert format_spread(mean_and_spread([1.0, 2.0, 3.0])) == "2.0000 ± 1.0000"
    assert format_spread(mean_and_spread([-0.5]), signed=True) == "-0.5000"
    with pytest.raises(ValueError, match="at least one value"):
        mean_and_spread([])


def test_paired_differences_subtract_the_same_seed():
    variant, baseline = {0: 3.0, 1: 3.5, 2: 2.5}, {0: 3.2, 1: 3.6, 2: 2.9}
    result = paired_differences(variant, baseline)
    assert result["per_seed"] == pytest.approx({0: -0.2, 1: -0.1, 2: -0.4})
    assert result["mean"] == pytest.approx(-0.7 / 3)
    assert result["std"] == pytest.approx(math.sqrt(((0.1 / 3) ** 2 + (0.4 / 3) ** 2 + (0.5 / 3) ** 2) / 2))
    with pytest.raises(ValueError, match="same seeds"):
        paired_differences({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})


def test_aggregate_over_seeds_against_the_baseline():
    runs = {"base": {0: {"eval_loss": 2.0, "eval_bpb": 1.0}, 1: {"eval_loss": 4.0, "eval_bpb": 2.0}},
            "new": {0: {"eval_loss": 1.5, "eval_bpb": 0.5}, 1: {"eval_loss": 3.0, "eval_bpb": None}}}
    summary = aggregate(runs, "base")
    assert summary["base"]["eval_loss"] == {"mean": 3.0, "std": pytest.approx(math.sqrt(2)), "n": 2}
    assert "eval_loss_vs_baseline" not in summary["base"]
    assert summary["new"]["eval_loss_vs_baseline"]["per_seed"] == {0: -0.5, 1: -1.0}
    assert summary["new"]["eval_loss_vs_baseline"]["mean"] == -0.75
    assert "eval_bpb" not in summary["new"]  # not measured in every run: left out, never partly averaged


def test_bad_input_gets_a_clear_error(tmp_path, corpus):
    with pytest.raises(ValueError, match="unknown group 'resnet'"):
        reproduce("resnet", corpus, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="unknown scale 'huge'"):
        reproduce("kvm", corpus, "huge", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="--seeds 0 is invalid"):
        reproduce("kvm", corpus, seeds=0, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="--core_data .* holds none of the CORE files"):
        reproduce("kvm", corpus, core_data=str(tmp_path), output_dir=str(tmp_path))
    with pytest.raises(SystemExit, match="error: --max_steps 0 is invalid"):
        run_script("reproduce", "kvm", "--corpus", corpus, "--max_steps", "0", "--output_dir", str(tmp_path))


def test_every_group_has_paper_scale_configs():
    for group in GROUPS.values():
        for variant in group.variants:
            assert "paper" in variant.config, (group.name, variant.name)
    satformer = GROUPS["satformer"]
    configs = {}
    for variant in satformer.variants:  # the SATFormer-small backbone with each variant's value path
        fields = source_config(satformer, variant, SCALES["paper"])
        fields.pop("training")
        configs[variant.name] = MODEL_TYPES[fields.pop("model_type")][0](**fields)
    assert {name: (config.value_source, config.value_mix) for name, config in configs.items()} == {
        "baseline": ("residual", "substitute"), "resformer": ("v1", "add"), "satformer": ("v1", "relu_gate")}
    assert {(config.hidden_size, config.num_hidden_layers, config.qk_norm, config.tie_word_embeddings)
            for config in configs.values()} == {(768, 11, "rmsnorm", True)}


PAPER_PLANS = {  # (block size, global batch, the baseline's budget) from the papers' recipes in configs/
    "bov": (2048, 256, {"flops": 1.5e18}), "rd_attnres": (2048, 256, {"tokens": 2e9}),
    "satformer": (4096, 512, {"tokens": 2384 * 512 * 4096}), "kvm": (8192, 64, {"tokens": 6000 * 64 * 8192})}


def test_paper_scale_runs_the_baselines_recipe():
    assert set(PAPER_PLANS) == set(GROUPS)
    for name, group in GROUPS.items():
        assert run_plan(group, SCALES["paper"]) == PAPER_PLANS[name], name


def test_loss_by_length_scores_the_same_tokens_from_longer_contexts(corpus):
    """With a window of 4 keys in 3 layers every token reads at most 9 tokens back, so from contexts of 32 and 64
    tokens the 15 scored tokens (each with at least 16 tokens before it) get equal losses (RoPE is relative); full
    attention reads further back: different ones."""
    tokenizer = train_tokenizer(training_texts(corpus, 50_000), 300)
    fields = dict(vocab_size=len(tokenizer), max_position_embeddings=128)
    windowed = tiny_model(mixer_types=["sliding_attention"] * TINY["num_hidden_layers"], sliding_window=4, **fields)
    losses = long_context.loss_by_length(windowed, corpus, tokenizer, 16, [16, 32, 64])
    assert list(losses) == [16, 32, 64] and losses[32] == pytest.approx(losses[64], rel=1e-5)
    full = long_context.loss_by_length(tiny_model(**fields), corpus, tokenizer, 16, [32, 64])
    assert full[32] != pytest.approx(full[64], rel=1e-3)


def check_outputs(results, group_dir, group):
    names = [variant.name for variant in group.variants]
    assert list(results["variants"]) == names
    table = (group_dir / "results.md").read_text()
    for name in names:
        assert f"| {name} | " in table
        run = results["runs"][name][0]
        assert math.isfinite(run["eval_loss"]) and run["history"]["train"]
    assert json.loads((group_dir / "results.json").read_text())["summary"].keys() == set(names)
    assert (group_dir / "loss_curves.png").stat().st_size > 0 and (group_dir / "layer_diagnostics.png").exists()
    variant, statistic = MECHANISM[group.name]
    assert results["runs"][variant][0]["layers"][statistic]  # the mechanism's per-layer diagnostic, reported


@pytest.mark.slow
@pytest.mark.parametrize("group_name", ["satformer", "rd_attnres", "kvm"])
def test_group_end_to_end_at_micro_scale(group_name, corpus, core_data, tmp_path, monkeypatch):
    group = GROUPS[group_name]
    with_core = group_name == "satformer"  # CORE on every final model, once (lm-eval per model: seconds each)
    if group.niah_context_multiples:  # one NIAH cell (one length, one depth, one sample): the wiring, in seconds
        monkeypatch.setattr(long_context, "NIAH_DEPTHS", (50,))
        monkeypatch.setattr(long_context, "NIAH_SAMPLES", 1)
        monkeypatch.setitem(GROUPS, group_name, dataclasses.replace(group, niah_context_multiples=(4,)))
    results = reproduce(group_name, corpus, "tiny", seeds=1, output_dir=str(tmp_path), max_steps=1,
                        core_data=core_data if with_core else None)
    check_outputs(results, tmp_path / group_name, group)
    table = (tmp_path / group_name / "results.md").read_text()
    assert "a smoke run, budgets not matched" in table
    assert ("| CORE | Δ CORE vs baseline |" in table) == with_core
    if with_core:
        for name in results["variants"]:
            record = json.loads((tmp_path / group_name / "runs" / name / "seed0" / "core" / "results.json").read_text())
            assert set(record["summary"]) == {"copa", "winogrande"}
            assert results["runs"][name][0]["core"] == record["core_score"]
            assert results["summary"][name]["core"]["mean"] == record["core_score"]
    if group.loss_context_multiples:  # KVM: loss and NIAH beyond the training length, for every model
        block = SCALES["tiny"].block_size
        for name in results["variants"]:
            run = results["runs"][name][0]
            assert block in run["loss_by_length"] and all(math.isfinite(x) for x in run["loss_by_length"].values())
            assert set(run["loss_by_length"]) <= {multiple * block for multiple in group.loss_context_multiples}
            assert list(run["niah_by_length"]) == [4 * block]
            assert all(0 <= accuracy <= 1 for accuracy in run["niah_by_length"].values())
            assert (tmp_path / group_name / "runs" / name / "seed0" / "niah" / "niah_heatmap.png").is_file()
        assert set(results["long_context"]) == {"loss_by_length", "niah_by_length"}
        assert "NIAH accuracy by context length" in table and (tmp_path / group_name / "long_context.png").is_file()


@pytest.mark.slow
def test_bov_table_is_flop_matched(corpus, tmp_path, monkeypatch):
    """Every row gets the baseline's FLOPs: rows without v_proj in their table layers train on more tokens."""
    tiny = SCALES["tiny"]
    monkeypatch.setitem(SCALES, "tiny", dataclasses.replace(tiny, baseline_tokens=2 * tiny.batch_size * tiny.block_size))
    results = reproduce("bov", corpus, "tiny", seeds=1, output_dir=str(tmp_path))
    check_outputs(results, tmp_path / "bov", GROUPS["bov"])
    assert len(results["variants"]) == 14  # BoV Table 1's 13 rows and BoV
    budget = results["runs"]["row01_baseline"][0]["flops"]
    step_tokens = tiny.batch_size * tiny.block_size
    for name, variant in results["variants"].items():
        flops = results["runs"][name][0]["flops"]
        assert budget <= flops < budget + step_tokens * variant["flops_per_token"]  # ceil to whole steps
    assert results["runs"]["bov"][0]["global_step"] > results["runs"]["row01_baseline"][0]["global_step"]


@pytest.mark.slow
def test_rerun_resumes_and_retrains_nothing(corpus, tmp_path, capsys):
    arguments = ["satformer", "--corpus", corpus, "--seeds", "2", "--max_steps", "1", "--output_dir", str(tmp_path)]
    run_script("reproduce", *arguments)
    finals = sorted((tmp_path / "satformer" / "runs").glob("*/seed*/final/model.safetensors"))
    assert len(finals) == 6
    written = {path: path.stat().st_mtime_ns for path in finals}
    capsys.readouterr()
    run_script("reproduce", *arguments)
    assert capsys.readouterr().out.count("nothing to do") == 6
    assert {path: path.stat().st_mtime_ns for path in finals} == written
    results = json.loads((tmp_path / "satformer" / "results.json").read_text())
    runs, difference = results["runs"], results["summary"]["satformer"]["eval_loss_vs_baseline"]
    for seed in ("0", "1"):  # paired per seed
        expected = runs["satformer"][seed]["eval_loss"] - runs["baseline"][seed]["eval_loss"]
        assert difference["per_seed"][seed] == pytest.approx(expected)
    with pytest.raises(SystemExit, match="error: .* holds runs of another setting"):
        run_script("reproduce", *arguments[:-2], "--output_dir", str(tmp_path), "--seeds", "3")
