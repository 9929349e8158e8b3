"""Checkpoints load with trust_remote_code=True where hf_valuearch is not importable, for every model type."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hf_valuearch import MODEL_TYPES
from tests.common import random_ids, tiny_model

ALL_TYPES = sorted(MODEL_TYPES)

LOADER = textwrap.dedent("""
    import sys
    sys.modules["hf_valuearch"] = None  # any `import hf_valuearch` now raises ImportError
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    save_root, ids_path, out_path = sys.argv[1:4]
    ids = torch.load(ids_path)
    results = {}
    for model_type in sys.argv[4:]:
        path = f"{save_root}/{model_type}"
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
        base = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            logits = model(ids).logits
            hidden = base(ids).last_hidden_state
        generated = model.generate(ids[:, :6], attention_mask=torch.ones_like(ids[:, :6]), max_new_tokens=8,
                                   do_sample=False, pad_token_id=0)
        results[model_type] = dict(config_class=type(config).__name__, model_class=type(model).__name__,
                                   base_class=type(base).__name__, logits=logits, hidden=hidden,
                                   generated=generated)
    torch.save(results, out_path)
""")


@pytest.fixture(scope="module")
def remote_results(tmp_path_factory):
    """Save a tiny model of every type, load them all in one fresh interpreter, return what it computed."""
    root = tmp_path_factory.mktemp("remote")
    ids = random_ids(2, 12)
    torch.save(ids, root / "ids.pt")
    local = {}
    for model_type in ALL_TYPES:
        model = tiny_model(model_type)
        model.save_pretrained(root / model_type)
        with torch.no_grad():
            local[model_type] = dict(
                logits=model(ids).logits, hidden=model.model(ids).last_hidden_state,
                generated=model.generate(ids[:, :6], attention_mask=torch.ones_like(ids[:, :6]), max_new_tokens=8,
                                         do_sample=False, pad_token_id=0),
                auto_map=json.loads((root / model_type / "config.json").read_text())["auto_map"])
    (root / "loader.py").write_text(LOADER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HOME"] = str(root / "hf_home")
    env["HF_HUB_OFFLINE"] = "1"
    subprocess.run([sys.executable, str(root / "loader.py"), str(root), str(root / "ids.pt"), str(root / "out.pt"),
                    *ALL_TYPES], check=True, cwd=root, env=env)
    return local, torch.load(root / "out.pt")


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_remote_code_load_matches_in_process_model(model_type, remote_results):
    local, remote = remote_results[0][model_type], remote_results[1][model_type]
    config_class, _, lm_class = MODEL_TYPES[model_type]
    assert set(local["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
    assert remote["config_class"] == config_class.__name__ and remote["model_class"] == lm_class.__name__
    assert remote["base_class"] == lm_class.base_model_class.__name__
    assert torch.equal(remote["logits"], local["logits"])
    assert torch.equal(remote["hidden"], local["hidden"])
    assert torch.equal(remote["generated"], local["generated"])
