"""Optimizer groups, Muon + AdamW and the schedules (hf_valuearch/training/optim.py), for every model type."""

import copy

import pytest
import torch

from hf_valuearch import MODEL_TYPES
from hf_valuearch.training.optim import NO_DECAY, CombinedOptimizer, OptimizerRecipe, build_optimizer, group_parameters
from tests.common import random_ids, tiny_model


def expected_group(model_type: str, name: str, tied: bool) -> str:
    """Which group each parameter belongs to, written out by name."""
    leaf = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
    if name == "model.embed_tokens.weight":
        return "embeddings"
    if name == "lm_head.weight":
        assert not tied
        return "head"
    if leaf == "value_table":
        return "value_tables"
    if ".router." in name or name.startswith("model.readout."):
        return "routing"
    if leaf == "v1_gate":
        return "gates"
    if leaf in ("value_scale", "residual_scale", "source_scale", "state_temperature", "window_temperature"):
        return "scalars"
    if "norm" in leaf:
        return "norms"
    assert leaf in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "merge_gate_proj"), name
    return "matrices"


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_every_parameter_lands_in_its_group(model_type):
    model = tiny_model(model_type)
    groups = group_parameters(model)
    names = [name for members in groups.values() for name, _ in members]
    assert sorted(names) == sorted(name for name, _ in model.named_parameters())  # each exactly once
    for group, members in groups.items():
        for name, _ in members:
            assert group == expected_group(model_type, name, model.config.tie_word_embeddings), name
    assert ("value_tables" in groups) == (model_type == "bov")
    assert ("routing" in groups) == (model_type in ("attnres", "rd_attnres"))
    assert ("gates" in groups) == (model_type == "satformer")


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_muon_takes_the_matrices_and_no_decay_groups_keep_zero(model_type):
    model = tiny_model(model_type)
    recipe = OptimizerRecipe(optimizer="muon", lr={"scalars": 0.5, "value_tables": 0.15})
    optimizer, table = build_optimizer(model, recipe, learning_rate=0.02, weight_decay=0.1)
    assert isinstance(optimizer, CombinedOptimizer)
    muon, adamw = optimizer.optimizers[:2]
    assert isinstance(muon, torch.optim.Muon) and [g["group"] for g in muon.param_groups] == ["matrices"]
    for group in optimizer.param_groups:
        assert group["weight_decay"] == (0.0 if group["group"] in NO_DECAY else 0.1)
        assert group["lr"] == {"scalars": 0.5, "value_tables": 0.15}.get(group["group"], 0.02)
        assert group["group"] in table


def test_combined_optimizer_resumes_exactly():
    def steps(model, optimizer, count):
        for _ in range(count):
            ids = random_ids(2, 8, seed=3)
            model(ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    model = tiny_model("bov").train()
    optimizer, _ = build_optimizer(model, OptimizerRecipe(optimizer="muon"), 0.01, 0.0)
    steps(model, optimizer, 2)
    twin = copy.deepcopy(model)
    twin_optimizer, _ = build_optimizer(twin, OptimizerRecipe(optimizer="muon"), 0.01, 0.0)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    steps(model, optimizer, 2)
    steps(twin, twin_optimizer, 2)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name


def test_schedules():
    nanochat = OptimizerRecipe(warmup_steps=4, warmdown_fraction=0.5, final_lr_fraction=0.05)  # BoV Table 6 shape
    values = [nanochat.lr_multiplier(step, 20) for step in range(20)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0] and values[4:10] == [1.0] * 6
    assert values[10] == pytest.approx(1.0) and values[19] == pytest.approx(0.05 + 0.95 * 0.1)
    cosine = OptimizerRecipe(schedule_shape="cosine")
    assert cosine.lr_multiplier(0, 10) == 1.0 and cosine.lr_multiplier(5, 10) == pytest.approx(0.5)


@pytest.mark.parametrize("fields, match", [
    ({"optimizer": "sgd"}, "optimizer='sgd'"), ({"lr": {"matrix": 0.1}}, "group 'matrix'"),
    ({"warmdown_fraction": 1.5}, "warmdown_fraction"), ({"table_optimizer": "nope"}, "table_optimizer"),
])
def test_bad_recipes(fields, match):
    with pytest.raises(ValueError, match=match):
        OptimizerRecipe(**fields)
