"""Every registered model type behaves as a first-class transformers model (issue 8): gradients under both
gradient-checkpointing modes, DDP, weight init and vocabulary resizing, the cache `generate` builds (assisted and
prompt-lookup decoding), clear errors.

Shapes are those of transformers' common model tests: vocab 99, hidden 32, intermediate 37, 2 layers, 4 heads,
2 KV heads; KVM layers get a window of one 4-token chunk, so that 9 tokens already merge into their state.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache

from hf_valuearch import MODEL_TYPES
from hf_valuearch.cache_valuearch import ValueArchCache
from hf_valuearch.compat import output_cache
from hf_valuearch.value_paths import token_x0, value_table_paths
from tests.common import counting_layer_runs

ALL_TYPES = sorted(MODEL_TYPES)
SHAPES = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, pad_token_id=0)
KVM_SHAPES = dict(kvm_chunk_size=4, kvm_window_chunks=1, kvm_state_min_slots=4)


def conformance_config(model_type: str, **overrides):
    shapes = {**SHAPES, **(KVM_SHAPES if model_type == "kvm" else {})}
    return MODEL_TYPES[model_type][0](**{**shapes, **overrides})


def conformance_model(model_type: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return MODEL_TYPES[model_type][2](conformance_config(model_type, **overrides))


def conformance_ids(batch: int = 2, length: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, SHAPES["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def loss_gradients(model, ids) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    model(ids, labels=ids).loss.backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}


# --- gradients --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_every_parameter_gets_a_gradient(model_type):
    """No dead parameter (e.g. a W_V the value path never reads): DDP without find_unused_parameters needs it."""
    grads = loss_gradients(conformance_model(model_type).train(), conformance_ids())
    assert [name for name, grad in grads.items() if grad is None] == []


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_gradient_checkpointing_gives_the_same_gradients(model_type, use_reentrant):
    model = conformance_model(model_type).train()
    ids = conformance_ids()
    expected = loss_gradients(model, ids)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    with counting_layer_runs(model) as runs:
        checkpointed = loss_gradients(model, ids)
    assert runs == [2] * model.config.num_hidden_layers  # forward, then the recompute in backward
    for name, grad in expected.items():
        assert checkpointed[name] is not None, name
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_ddp_with_gradient_checkpointing_trains_every_model_type_as_one_process_does():
    """2 CPU processes (gloo), find_unused_parameters=False, both use_reentrant values: tests/ddp_worker.py."""
    worker = Path(__file__).with_name("ddp_worker.py")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert result.stdout.count("ddp ok") == len(MODEL_TYPES)


# --- initialisation and resizing ------------------------------------------------------------------------------


def test_init_weights_and_post_init_keep_trained_value_tables():
    model = conformance_model("bov")
    tables = [path.value_table.weight for path in value_table_paths(model.model).values()]
    assert tables
    with torch.no_grad():
        for table in tables:
            table.mul_(3.0).add_(1.0)  # "trained"
    trained = [table.clone() for table in tables]
    model.post_init()
    model.init_weights()
    for table, expected in zip(tables, trained):
        assert torch.equal(table, expected)


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_resize_token_embeddings_then_forward_and_post_init(model_type):
    model = conformance_model(model_type).eval()
    ids = conformance_ids()
    with torch.no_grad():
        before = model(ids).logits
        model.resize_token_embeddings(120)
        grown = model(torch.cat((ids, torch.tensor([[105], [119]])), dim=1)).logits
        model.post_init()
        after = model(ids).logits
    assert grown.shape[-1] == 120 and model.config.vocab_size == 120
    torch.testing.assert_close(after[..., :99], before)  # old tokens: the same model
    with torch.no_grad():
        model.resize_token_embeddings(50)
        assert model(ids.clamp(max=49)).logits.shape[-1] == 50


def test_resized_value_tables_align_new_rows_and_keep_old_ones():
    """New rows are W_V RMSNorm(e[t]) for the W_V the table was aligned with; old rows are kept; shrinking cuts."""
    model = conformance_model("bov", tie_word_embeddings=False)
    eps = model.config.rms_norm_eps
    paths = value_table_paths(model.model)
    projections = {}
    with torch.no_grad():
        for layer_idx, path in paths.items():
            projections[layer_idx] = torch.randn(path.value_table.embedding_dim, SHAPES["hidden_size"])
            path.value_table.weight.copy_(token_x0(model.model.embed_tokens.weight, eps) @ projections[layer_idx].T)
    old = {i: path.value_table.weight.clone() for i, path in paths.items()}
    model.resize_token_embeddings(130, mean_resizing=False)
    x0_new = token_x0(model.model.embed_tokens.weight.detach(), eps)[99:]
    for layer_idx, path in paths.items():
        table = path.value_table.weight
        assert table.shape == (130, path.value_table.embedding_dim)
        assert torch.equal(table[:99], old[layer_idx])
        torch.testing.assert_close(table[99:], x0_new @ projections[layer_idx].T, rtol=1e-4, atol=1e-5)
    model.resize_token_embeddings(40)
    for layer_idx, path in paths.items():
        assert torch.equal(path.value_table.weight, old[layer_idx][:40])


# --- generation: the cache generate builds, assisted decoding -------------------------------------------------


def greedy(model, ids, **kwargs):
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                          pad_token_id=0, **kwargs)


@pytest.mark.parametrize("model_type", [t for t in ALL_TYPES if t != "kvm"])
def test_assisted_and_prompt_lookup_decoding_equal_greedy(model_type):
    model = conformance_model(model_type).eval()
    assistant = conformance_model(model_type, seed=1).eval()
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])  # repeats: prompt lookup proposes drafts
    expected = greedy(model, ids)
    assert torch.equal(greedy(model, ids, assistant_model=assistant), expected)
    assert torch.equal(greedy(model, ids, prompt_lookup_num_tokens=3), expected)


def test_kvm_refuses_assisted_decoding_and_cropping_clearly():
    model = conformance_model("kvm").eval()
    ids = conformance_ids(1)
    with pytest.raises(ValueError, match="cannot be cropped"):
        greedy(model, ids, prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match="cannot be cropped"):
        greedy(model, ids, assistant_model=conformance_model("kvm", seed=1))
    cache = output_cache(model(ids, use_cache=True))
    with pytest.raises(ValueError, match="cannot be cropped"):
        cache.crop(4)


# --- clear errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_generate_builds_a_value_arch_cache_and_refuses_static_caches(model_type):
    model = conformance_model(model_type).eval()
    ids = conformance_ids(1)
    out = model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    assert isinstance(output_cache(out), ValueArchCache)
    with pytest.raises(ValueError, match="cache_implementation='static' is not supported"):
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0, cache_implementation="static")


@pytest.mark.parametrize("model_type", ["kvm", "bov"])
def test_foreign_cache_is_refused_naming_value_arch_cache(model_type):
    model = conformance_model(model_type).eval()
    with pytest.raises(ValueError, match="need a ValueArchCache, got DynamicCache"):
        model(conformance_ids(), cache=DynamicCache(), use_cache=True)


def test_kvm_refuses_output_attentions():
    model = conformance_model("kvm", mixer_types=["full_attention", "kvm"]).eval()
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="output_attentions=True: KVM layers"):
        model(conformance_ids(), output_attentions=True)


def test_invalid_field_set_after_construction_fails_at_save_pretrained(tmp_path):
    config = conformance_config("valuearch")
    config.sliding_window = 2  # no sliding layer
    with pytest.raises(ValueError, match="sliding_window"):
        config.save_pretrained(tmp_path)
    model = conformance_model("valuearch")
    model.config.sliding_window = 2
    with pytest.raises(ValueError, match="sliding_window"):
        model.save_pretrained(tmp_path)


# --- torch.export and torch.compile ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_export_and_fullgraph_compile_equal_eager(model_type):
    """Every type traces in one graph on unpadded input (no data-dependent checks in the forward); KVM's padded
    batches split per sequence, so KVM models do not claim `_can_compile_fullgraph`."""
    model = conformance_model(model_type).eval()
    assert model._can_compile_fullgraph == (model_type != "kvm")
    ids = conformance_ids()
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(ids).logits
        exported = torch.export.export(model, (ids,), kwargs={"use_cache": False}).module()
        torch.testing.assert_close(exported(ids, use_cache=False).logits, expected, rtol=1e-5, atol=1e-5)
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(ids, use_cache=False).logits, expected, rtol=1e-5, atol=1e-5)
        # with a cache (what a training forward builds by default) and symbolic shapes, as Trainer's compile sees
        compiled = torch.compile(model, backend="eager", dynamic=True)
        torch.testing.assert_close(compiled(ids).logits, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="input_ids must lie in"):  # the eager check is still there
        model(ids + SHAPES["vocab_size"])


# --- device placement and parallel plans ----------------------------------------------------------------------


def alternating_device_map(model, devices: tuple[str, str]) -> dict[str, str]:
    """Every module of the base model (each decoder layer on its own) on the other device than the one before;
    the LM head with the embeddings (they may be tied)."""
    names = [f"model.{name}" for name, _ in model.model.named_children() if name != "layers"]
    names[1:1] = [f"model.layers.{i}" for i in range(len(model.model.layers))]  # after the embeddings
    device_map = {name: devices[i % 2] for i, name in enumerate(names)}
    return {**device_map, "lm_head": device_map["model.embed_tokens"]}


@pytest.mark.parametrize("devices", [("cpu", "cpu"), pytest.param(("cpu", "cuda:0"), marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU: splits the model across cpu and cuda"))])
@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_device_map_split_gives_the_same_logits_and_generation(model_type, devices, tmp_path):
    """x0, V1, token ids and depth sources follow the layers across devices (device_map, accelerate's hooks)."""
    model = conformance_model(model_type).eval()
    model.save_pretrained(tmp_path)
    split = type(model).from_pretrained(tmp_path, device_map=alternating_device_map(model, devices)).eval()
    assert {str(p.device) for p in split.parameters()} == set(devices)
    ids = conformance_ids()
    with torch.no_grad():
        torch.testing.assert_close(split(ids).logits.cpu(), model(ids).logits, rtol=1e-4, atol=1e-5)
    assert torch.equal(greedy(split, ids[:1]).cpu(), greedy(model, ids[:1]))


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_parallel_plans_match_llama(model_type):
    llama_config = LlamaConfig(**{k: v for k, v in SHAPES.items()})
    model, llama = conformance_model(model_type), LlamaForCausalLM(llama_config)
    assert model.fsdp_plan == llama.fsdp_plan
    assert model.tp_plan == llama.tp_plan
    assert set(model._skip_keys_device_placement) == set(llama._skip_keys_device_placement)
