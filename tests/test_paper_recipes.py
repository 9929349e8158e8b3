"""Paper presets carry their training recipe (optimizer, schedule, sequence length, batch, budget) and each has a
tiny twin with the same recipe that trains on CPU."""

from pathlib import Path

import pytest
from transformers import TrainingArguments

from hf_valuearch.training import OptimizerRecipe, load_config, plan_steps, read_config_file
from tests.common import REPO, run_script

CONFIGS = REPO / "configs"
PAPER_FILES = sorted([*CONFIGS.glob("value_paths/135m_*.json"), *CONFIGS.glob("value_paths/780m_*.json"),
                      *CONFIGS.glob("depth_routing/*_1*m.json"), *CONFIGS.glob("depth_routing/*_3*m.json"),
                      *CONFIGS.glob("kvm/*.json")])


def twin_of(path: Path) -> Path:
    if path.parent.name == "value_paths":
        return path.with_name("tiny_" + path.name.split("_", 1)[1])
    if path.parent.name == "depth_routing":
        return path.with_name(path.name.rsplit("_", 1)[0] + "_tiny.json")
    return path.parent / "tiny" / path.name


# file -> training tokens the recipe plans: BoV §5 (1.5e18 FLOPs: 1.97B tokens at 135M; 3.91e19: 8.39B for BoV at
# 780M), RD-AttnRes (2.0B tokens), KVM (6000 iterations of 64 x 8192 tokens, "3B")
EXPECTED = {"135m_row01_baseline": 1.97e9, "780m_bov": 8.39e9, "rd_attnres_120m": 2.0e9, "kvm_fixed256": 3.15e9}


@pytest.mark.parametrize("path", PAPER_FILES, ids=lambda p: p.stem)
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
    if path.stem in EXPECTED:
        tokens = steps * recipe["batch_sequences"] * recipe["block_size"]
        assert tokens == pytest.approx(EXPECTED[path.stem], rel=5e-3)
    twin_config, twin = load_config(str(twin_of(path))), read_config_file(str(twin_of(path)))[1]
    assert twin_config.model_type == config.model_type and twin_config.hidden_size <= 64
    assert twin["optimizer"]["optimizer"] == recipe["optimizer"]["optimizer"] and twin["max_steps"] <= 200


@pytest.mark.slow
def test_a_tiny_twin_trains_with_its_recipe(tmp_path, capsys):
    run_script("train", "--config", str(CONFIGS / "value_paths" / "tiny_bov.json"), "--output_dir", str(tmp_path),
               "--max_steps", "3", "--per_device_train_batch_size", "4", "--disable_tqdm", "true",
               "--eval_strategy", "no")
    out = capsys.readouterr().out
    assert "optimizer: muon" in out and "value_tables" in out and "budget: 3 steps x 1024 tokens" in out
    assert (tmp_path / "final" / "model.safetensors").is_file()
