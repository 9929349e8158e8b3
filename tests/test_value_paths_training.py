"""LoRA (PEFT, target_modules="all-linear") trains every value-path preset; BoV tables train via modules_to_save."""

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from tests.common import random_ids, tiny_model

PRESETS = {"bov": {}, "resformer": {}, "satformer": {}}


@pytest.mark.parametrize("model_type", sorted(PRESETS))
def test_lora_all_linear_trains_every_preset(model_type, tmp_path):
    modules_to_save = ["value_table"] if model_type == "bov" else None
    model = get_peft_model(tiny_model(model_type).train(),
                           LoraConfig(r=4, target_modules="all-linear", modules_to_save=modules_to_save))
    trainable = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    if model_type == "satformer":  # the SATFormer gate W_alpha is a linear layer: it gets an adapter too
        assert any("value_path.v1_gate.lora_B" in name for name in trainable)
    ids = random_ids(4, 12)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    changed = {name for name, p in model.named_parameters() if p.requires_grad and not torch.equal(p, trainable[name])}
    assert any("lora_B" in name for name in changed)

    if model_type == "bov":
        path = model.base_model.model.model.layers[2].self_attn.value_path
        assert "base_model.model.model.layers.2.self_attn.value_path.value_table.modules_to_save.default.weight" in changed
        assert not torch.equal(path.value_table.modules_to_save["default"].weight, path.value_table.original_module.weight)

    model.eval()
    model.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(tiny_model(model_type), tmp_path).eval()
    assert torch.allclose(reloaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6)
