"""Paper presets carry their training recipe (optimizer, schedule, sequence length, batch, budget) and each has a
tiny twin with the same recipe that trains on CPU."""

import json
import math
from pathlib import Path

import pytest
from transformers import TrainingArguments

from hf_valuearch.training import OptimizerRecipe, load_config, plan_steps, read_config_file
from tests.common import REPO, run_script

CONFIGS = REPO / "configs"
# every config file with a "training" recipe that is not itself a tiny twin
PAPER_FILES = sorted(path for path in CONFIGS.rglob("*.json") if "tiny" not in path.relative_to(CONFIGS).as_posix()
                     and "training" in json.loads(path.read_text()))


def twin_of(path: Path) -> Path:
    """The tiny twin, named by one of the folders' conventions: kvm/tiny/NAME (for kvm/NAME and kvm/350m/NAME),
    value_paths/tiny_ROW (for 135m_ROW / 780m_ROW), NAME_tiny (for NAME_SIZE: depth_routing, satformer)."""
    candidates = [path.parent / "tiny" / path.name, path.parent.parent / "tiny" / path.name,
                  path.with_name("tiny_" + path.name.split("_", 1)[-1]),
                  path.with_name(path.stem.rsplit("_", 1)[0] + "_tiny.json")]
    found = [candidate for candidate in candidates if candidate.is_file()]
    assert len(found) == 1, f"{path} needs exactly one tiny twin among {candidates}, found {found}"
    return found[0]


# file -> training tokens the recipe plans: BoV §5 (1.5e18 FLOPs: 1.97B tokens at 135M; 3.91e19: 8.39B for BoV at
# 780M), RD-AttnRes (2.0B tokens), SATFormer (int(5e9 / (512 x 4096)) = 2384 steps: "5B"; 20B), KVM (6000
# iterations of 64 x 8192 tokens, "3B"; 15000 at 350M, "7.5B")
EXPECTED = {"value_paths/135m_row01_baseline.json": 1.97e9, "value_paths/780m_bov.json": 8.39e9,
            "depth_routing/rd_attnres_120m.json": 2.0e9, "satformer/satformer_small.json": 5.0e9,
            "satformer/satformer_large.json": 2.0e10, "kvm/kvm_fixed256.json": 3.15e9,
            "kvm/350m/kvm_fixed256.json": 7.86e9}


def test_every_paper_family_is_found():
    folders = {path.relative_to(CONFIGS).parent.as_posix() for path in PAPER_FILES}
    assert folders == {"value_paths", "depth_routing", "satformer", "kvm", "kvm/350m"}
    assert set(EXPECTED) <= {path.relative_to(CONFIGS).as_posix() for path in PAPER_FILES}


@pytest.mark.parametrize("path", PAPER_FILES, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_paper_files_carry_a_recipe_and_have_a_tiny_twin(path, tmp_path):
    _, recipe = read_config_file(str(path))
    assert {"optimizer", "block_size", "batch_sequences", "data"} <= set(recipe)
    assert sum(name in recipe for name in ("max_steps", "tokens", "flops")) == 1
    OptimizerRecipe(**recipe["optimizer"])
    config = load_config(str(path))
    assert recipe["block_size"] <= config.max_position_embeddings
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=recipe["batch_sequences"])
    steps, _ = plan_steps(config, args, recipe["block_size"],
                          *(recipe.get(name) for name in ("max_steps", "tokens", "flops")))
    name = path.relative_to(CONFIGS).as_posix()
    if name in EXPECTED:
        tokens = steps * recipe["batch_sequences"] * recipe["block_size"]
        assert tokens == pytest.approx(EXPECTED[name], rel=5e-3)
    twin_config, twin = load_config(str(twin_of(path))), read_config_file(str(twin_of(path)))[1]
    assert twin_config.model_type == config.model_type and twin_config.hidden_size <= 64
    assert twin["optimizer"]["optimizer"] == recipe["optimizer"]["optimizer"] and twin["max_steps"] <= 200
    assert twin["optimizer"].get("schedule_shape") == recipe["optimizer"].get("schedule_shape")


def test_schedules_follow_the_papers_training_code():
    """SATFormer `train.py` get_lr: warmup (step + 1) / W, then cosine from lr to lr / 10 over the other steps;
    KVM-paper `train.py` get_lr_ratio: warmup, constant, then (steps - step) / warmdown_iters."""
    def schedule(name):
        recipe = read_config_file(str(CONFIGS / name))[1]
        return OptimizerRecipe(**recipe["optimizer"]), recipe["max_steps"]

    satformer, steps = schedule("satformer/satformer_small.json")
    warmup = satformer.warmup_steps
    for step in range(steps):
        cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))
        assert satformer.lr_multiplier(step, steps) == pytest.approx((step + 1) / warmup if step < warmup else cosine)
    for name, warmdown in (("kvm/kvm_fixed256.json", 5800), ("kvm/350m/kvm_fixed256.json", 14800)):
        kvm, steps = schedule(name)
        for step in range(steps):
            expected = (step + 1) / 200 if step < 200 else min(1.0, (steps - step) / warmdown)
            assert kvm.lr_multiplier(step, steps) == pytest.approx(expected), (name, step)


@pytest.mark.slow
def test_a_tiny_twin_trains_with_its_recipe(tmp_path, capsys):
    run_script("train", "--config", str(CONFIGS / "value_paths" / "tiny_bov.json"), "--output_dir", str(tmp_path),
               "--max_steps", "3", "--per_device_train_batch_size", "4", "--disable_tqdm", "true",
               "--eval_strategy", "no")
    out = capsys.readouterr().out
    assert "optimizer: muon" in out and "value_tables" in out and "budget: 3 steps x 1024 tokens" in out
    assert (tmp_path / "final" / "model.safetensors").is_file()
