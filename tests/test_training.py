"""Training paths: Trainer lowers the loss; gradient checkpointing leaves gradients unchanged."""

import pytest
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from hf_valuearch import MODEL_TYPES
from tests.common import counting_layer_runs, random_ids, tiny_model


class RepeatedSequences(Dataset):
    """A few fixed random sequences: a model can only lower its loss by learning them."""

    def __init__(self, count=8, length=16):
        self.ids = random_ids(count, length, seed=7)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def test_trainer_steps_lower_the_loss(tmp_path):
    model = tiny_model().train()
    data = RepeatedSequences()
    with torch.no_grad():
        before = model(data.ids, labels=data.ids).loss.item()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=12, per_device_train_batch_size=4,
                             learning_rate=3e-3, use_cpu=True, report_to=[], logging_steps=4, save_strategy="no",
                             disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data).train()
    with torch.no_grad():
        after = model.eval()(data.ids, labels=data.ids).loss.item()
    assert after < before - 0.1


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_gradient_checkpointing_gives_same_gradients(model_type):
    ids = random_ids(2, 12)

    def gradients(checkpointing):
        model = tiny_model(model_type).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        with counting_layer_runs(model) as runs:
            model(ids, labels=ids).loss.backward()
        assert runs == [2 if checkpointing else 1] * model.config.num_hidden_layers  # backward recomputed each layer
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 0
    for name in plain:
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-6), name
