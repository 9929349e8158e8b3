"""The lazy row update for BoV value tables (`table_optimizer="lazy_adamw"`, training/optim.py)."""

import copy

import torch

from hf_valuearch.training.optim import LazyRowAdamW, OptimizerRecipe, build_optimizer
from tests.common import random_ids, tiny_model

SETTINGS = dict(lr=1e-2, betas=(0.8, 0.995), eps=1e-8, weight_decay=0.1)


def test_rows_seen_at_every_step_follow_dense_adamw():
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(6, 4))
    dense_table = torch.nn.Parameter(table.detach().clone())
    lazy, dense = LazyRowAdamW([table], **SETTINGS), torch.optim.AdamW([dense_table], **SETTINGS)
    for _ in range(3):
        grad = torch.randn(6, 4)
        table.grad, dense_table.grad = grad.clone(), grad.clone()
        lazy.step()
        dense.step()
    torch.testing.assert_close(table, dense_table)


def test_unseen_rows_keep_value_and_moments():
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(6, 4))
    optimizer = LazyRowAdamW([table], **SETTINGS)
    table.grad = torch.randn(6, 4)
    optimizer.step()
    before = table.detach().clone(), *(optimizer.state[table][k].clone() for k in ("exp_avg", "exp_avg_sq"))
    table.grad = torch.zeros(6, 4)
    table.grad[[1, 4]] = torch.randn(2, 4)  # only the tokens 1 and 4 in this batch
    optimizer.step()
    after = table.detach(), *(optimizer.state[table][k] for k in ("exp_avg", "exp_avg_sq"))
    for old, new in zip(before, after):
        assert torch.equal(old[[0, 2, 3, 5]], new[[0, 2, 3, 5]])
        assert not torch.equal(old[[1, 4]], new[[1, 4]])


def test_bov_training_step_moves_only_the_batch_rows_with_lazy_tables():
    model = tiny_model("bov").train()
    first, second = random_ids(2, 8, seed=1), random_ids(2, 8, seed=2)
    unseen_now = sorted(set(first.flatten().tolist()) - set(second.flatten().tolist()))
    tables = {}
    for name in ("adamw", "lazy_adamw"):
        trained = copy.deepcopy(model)
        optimizer, _ = build_optimizer(trained, OptimizerRecipe(table_optimizer=name), 1e-2, 0.1)
        for ids in (first, second):
            trained(ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if ids is first:
                after_first = trained.model.layers[2].self_attn.value_path.value_table.weight.detach().clone()
        table = trained.model.layers[2].self_attn.value_path.value_table.weight.detach()
        tables[name] = (after_first[unseen_now], table[unseen_now])
    assert torch.equal(*tables["lazy_adamw"])  # the rows of the first batch's tokens stay put in the second step
    assert not torch.equal(*tables["adamw"])  # dense AdamW keeps moving them (momentum, weight decay)
