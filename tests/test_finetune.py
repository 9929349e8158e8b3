"""scripts/finetune.py: full and LoRA fine-tuning of every model type, mechanism parameters frozen or trained,
--merge writing a checkpoint that loads with trust_remote_code and equals the adapter model, loss on completions
only, and LoRA's default target modules registered without importing peft."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from hf_valuearch import MODEL_TYPES
from hf_valuearch.training.finetune import IGNORE_INDEX, PadToLongest, PromptCompletions, finetune, mechanism_parameters
from tests.common import REPO, random_ids, run_script, save_tiny_checkpoint

ALL_TYPES = sorted(MODEL_TYPES)
STEPS = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--save_steps", "2",
         "--use_cpu", "true", "--disable_tqdm", "true", "--seed", "0"]
ROWS = [{"prompt": f"the value of {word}", "completion": f" token {word} layer"} for word in "abcdefghijklmnop"]

MERGED_LOADER = textwrap.dedent("""
    import sys
    sys.modules["hf_valuearch"] = None  # as for someone without the package
    import torch
    from transformers import AutoModelForCausalLM
    root, ids_path, out_path = sys.argv[1:4]
    ids = torch.load(ids_path)
    logits = {}
    for model_type in sys.argv[4:]:
        model = AutoModelForCausalLM.from_pretrained(f"{root}/{model_type}/lora/merged", trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            logits[model_type] = model.eval()(ids).logits
    assert "peft" not in sys.modules, "loading a checkpoint imported peft"
    torch.save(logits, out_path)
""")


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """For every model type: a tiny checkpoint, fine-tuned fully (mechanism frozen) and with LoRA (mechanism
    trained, merged); the merged checkpoints loaded in one fresh interpreter without hf_valuearch."""
    root = tmp_path_factory.mktemp("finetune")
    data = root / "prompts.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in ROWS))
    ids = random_ids(2, 10, vocab=300)
    torch.save(ids, root / "ids.pt")
    for model_type in ALL_TYPES:
        # KVM chunks of 4 tokens: the training sequences (about 15 tokens) reach the compressed state
        save_tiny_checkpoint(root / model_type / "base", model_type, kvm_chunk_size=4, kvm_state_min_slots=4)
        run_script("finetune", "--model", str(root / model_type / "base"), "--data", str(data), "--output_dir",
                   str(root / model_type / "full"), "--mechanism", "freeze", *STEPS)
        run_script("finetune", "--model", str(root / model_type / "base"), "--data", str(data), "--output_dir",
                   str(root / model_type / "lora"), "--lora", "--lora_r", "4", "--merge", "--mechanism", "train",
                   *STEPS)
    (root / "loader.py").write_text(MERGED_LOADER)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(root / "modules"))
    subprocess.run([sys.executable, str(root / "loader.py"), str(root), str(root / "ids.pt"), str(root / "merged.pt"),
                    *ALL_TYPES], check=True, cwd=root, env=env)
    return root, ids, torch.load(root / "merged.pt")


def base_model(root, model_type: str):
    return MODEL_TYPES[model_type][2].from_pretrained(root / "base")


def parameters_without_gradient(model, ids) -> set[str]:
    """Parameters the forward does not use (e.g. the v_proj of BoV table layers)."""
    model.train()
    model(ids, labels=ids).loss.backward()
    return {name for name, p in model.named_parameters() if p.grad is None or not p.grad.any()}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_full_finetune_trains_the_weights_and_can_freeze_the_mechanism(model_type, finetuned):
    root, ids = finetuned[0] / model_type, finetuned[1]
    model = base_model(root, model_type)
    frozen = set(mechanism_parameters(model))
    # every named architecture has mechanism parameters but ResFormer, whose preset fixes its scales to 0.5 / 0.5
    assert bool(frozen) == (model_type not in ("valuearch", "resformer"))
    unused = parameters_without_gradient(model, ids)
    base, tuned = load_file(root / "base" / "model.safetensors"), load_file(root / "full" / "final" / "model.safetensors")
    assert base.keys() == tuned.keys()
    for name in base:
        assert torch.equal(base[name], tuned[name]) == (name in frozen or name in unused), name
    assert (root / "full" / "final" / "tokenizer.json").is_file()
    assert "hf_valuearch" in (root / "full" / "final" / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_lora_merge_loads_remotely_and_equals_the_adapter_model(model_type, finetuned):
    from peft import PeftModel

    root, ids, merged_logits = finetuned[0] / model_type, finetuned[1], finetuned[2]
    adapter_model = PeftModel.from_pretrained(base_model(root, model_type), root / "lora" / "final").eval()
    with torch.no_grad():
        adapter_logits = adapter_model(ids).logits
        base_logits = base_model(root, model_type).eval()(ids).logits
    assert not torch.allclose(adapter_logits, base_logits, atol=1e-4)  # the adapter changed the model
    torch.testing.assert_close(merged_logits[model_type], adapter_logits, atol=1e-5, rtol=1e-5)

    model = base_model(root, model_type)
    mechanism, unused = set(mechanism_parameters(model)), parameters_without_gradient(model, ids)
    base, merged = load_file(root / "base" / "model.safetensors"), load_file(root / "lora" / "merged" / "model.safetensors")
    assert base.keys() == merged.keys()  # no PEFT wrapper names left
    for name in base:
        changed = not torch.equal(base[name], merged[name])
        # --mechanism train: the mechanism trained with the adapter, merged into the checkpoint; besides, only
        # LoRA's default targets change, as for Llama (a zero gradient at the start may turn non-zero later)
        if name in mechanism or name.endswith(("q_proj.weight", "v_proj.weight")):
            assert changed or name in unused, name
        else:
            assert not changed, name


def test_lora_defaults_target_q_and_v_for_every_type_as_for_llama(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        import hf_valuearch
        assert "peft" not in sys.modules, "import hf_valuearch imported peft"
        from peft import LoraConfig, get_peft_model
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping
        sys.path.insert(0, {str(REPO)!r})
        from tests.common import tiny_model
        for model_type in hf_valuearch.MODEL_TYPES:
            assert mapping[model_type] == mapping["llama"], model_type
            model = get_peft_model(tiny_model(model_type), LoraConfig(r=2))
            targets = {{name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in model.named_parameters() if "lora_A" in name}}
            assert targets == {{"q_proj", "v_proj"}}, (model_type, targets)
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_prompt_completion_loss_and_gradients_cover_the_completion_only():
    from tests.common import tiny_model

    class CharTokenizer:
        eos_token_id = 2

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [3 + ord(c) % 90 for c in text]}

    rows = [{"prompt": "abc", "completion": "de"}, {"prompt": "a", "completion": "bcdef"}]
    batch = PadToLongest(pad_token_id=0)(list(PromptCompletions(rows, CharTokenizer(), block_size=16)))
    assert batch["labels"][0].tolist() == [IGNORE_INDEX] * 3 + [3 + ord("d") % 90, 3 + ord("e") % 90, 2] + [IGNORE_INDEX]
    assert batch["attention_mask"].tolist() == [[1] * 6 + [0], [1] * 7]
    model = tiny_model("bov")
    parameters = list(model.parameters())
    loss = model(**batch).loss
    # the same loss by hand: cross-entropy of each completion token given everything before it, nothing else
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    terms = [torch.nn.functional.cross_entropy(logits[row, t - 1], batch["input_ids"][row, t], reduction="sum")
             for row, (start, end) in enumerate([(3, 6), (1, 7)]) for t in range(start, end)]
    manual = torch.stack(terms).sum() / len(terms)
    torch.testing.assert_close(loss, manual)
    grads = torch.autograd.grad(loss, parameters, allow_unused=True)
    manual_grads = torch.autograd.grad(manual, parameters, allow_unused=True)
    for grad, manual_grad in zip(grads, manual_grads):
        assert (grad is None) == (manual_grad is None)
        if grad is not None:
            torch.testing.assert_close(grad, manual_grad)


def test_bad_arguments_and_data_fail_with_one_line(tmp_path):
    save_tiny_checkpoint(tmp_path / "base")
    bad = tmp_path / "bad.jsonl"
    cases = [
        ([json.dumps({"prompt": "a"})], "row 1 has ['prompt']: in a prompt/completion file every row needs string "
                                        "'prompt' and 'completion'"),
        ([json.dumps({"prompt": "a", "completion": "b"}), json.dumps({"text": "a"})], "row 2 has ['text']"),
        ([json.dumps({"prompt": "a", "completion": "b"}), "{not json"], "line 2 is not JSON"),
    ]
    for lines, expected in cases:
        bad.write_text("\n".join(lines))
        with pytest.raises(SystemExit, match=re.escape(expected)):
            run_script("finetune", "--model", str(tmp_path / "base"), "--data", str(bad), "--output_dir",
                       str(tmp_path / "out"))
    with pytest.raises(SystemExit, match="--merge merges LoRA adapters into the weights; it needs --lora"):
        run_script("finetune", "--model", str(tmp_path / "base"), "--data", str(bad), "--output_dir",
                   str(tmp_path / "out"), "--merge")
    with pytest.raises(SystemExit, match="is not an hf_valuearch checkpoint"):
        run_script("finetune", "--model", str(tmp_path), "--data", str(bad), "--output_dir", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_text_rows_are_packed_into_blocks_with_a_held_out_eval(tmp_path, capsys):
    save_tiny_checkpoint(tmp_path / "base")
    rows = [{"text": f"the value of token {word} in layer {word}"} for word in "abcdefghijklmnopqrstuvwxyz"]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    run_script("finetune", "--model", str(tmp_path / "base"), "--data", str(tmp_path / "docs.jsonl"), "--output_dir",
               str(tmp_path / "out"), "--block_size", "8", *STEPS)
    metrics = json.loads((tmp_path / "out" / "final" / "training_metrics.json").read_text())
    assert metrics["global_step"] == 2 and metrics["method"] == "full" and metrics["eval_loss"] > 0
    assert metrics["base_model"] == str(tmp_path / "base")


def test_kvm_examples_too_short_for_the_state_make_ddp_search_unused_parameters(finetuned, tmp_path, capsys):
    """Prompt/completion examples shorter than KVM's window + a chunk leave its state key norm and merge gate
    without gradients: DDP must search for unused parameters (or refuse a run that forbids the search)."""
    base = str(finetuned[0] / "kvm" / "base")
    data = tmp_path / "short.jsonl"
    data.write_text(json.dumps({"prompt": "the value", "completion": " bank"}) + "\n")
    with pytest.raises(ValueError, match=r"the shortest example \(\d+ tokens, prompt \+ completion\) leaves .* "
                                         r"at least \d+ tokens"):
        finetune(base, str(data), str(tmp_path / "refused"), ddp_find_unused_parameters=False, max_steps=1)
    finetune(base, str(data), str(tmp_path / "searched"), max_steps=1, per_device_train_batch_size=1)
    assert "is shorter than the" in capsys.readouterr().out
