"""Block AttnRes / RD-AttnRes through the transformers paths: cache, generate, gradient checkpointing,
save/load, conversion (in memory and scripts/convert.py), Trainer logging, bfloat16."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from hf_valuearch import AttnResForCausalLM, RdAttnResForCausalLM
from hf_valuearch.compat import output_cache
from hf_valuearch.conversion import convert
from hf_valuearch.conversion.depth_routing import attnres_to_rd_attnres
from hf_valuearch.training.depth_logging import DepthRouteLoggingCallback
from hf_valuearch.depth_routing import record_depth_routes
from scripts.convert import main as convert_main
from tests.common import TINY, counting_layer_runs, prefill_then_decode, random_ids, tiny_model
from tests.test_depth_routing import randomize_routes
from tests.test_training import RepeatedSequences

ROUTED = [("attnres", {}), ("rd_attnres", {"value_route": "learned"}), ("rd_attnres", {"value_route": "frozen"})]
ROUTED_IDS = ["attnres", "rd_learned", "rd_frozen"]


@pytest.mark.parametrize("model_type,extra", ROUTED, ids=ROUTED_IDS)
def test_decode_equals_prefill_with_trained_routes(model_type, extra):
    """Depth mixing is per token, so the sequence KV cache is unchanged: incremental decoding gives the
    full forward's logits, and greedy generation is the same with and without the cache."""
    model = randomize_routes(tiny_model(model_type, attnres_block_size=3, **extra), scale=0.5)
    ids = random_ids(2, 14)
    full, stepped = prefill_then_decode(model, ids, 6)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)
    prompt = ids[:, :8]
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompt, use_cache=True, **kwargs), model.generate(prompt, use_cache=False, **kwargs))


def test_gradient_checkpointing_same_gradients_with_trained_routes():
    ids = random_ids(2, 12)

    def gradients(checkpointing):
        model = randomize_routes(tiny_model("rd_attnres", attnres_block_size=3), scale=0.5).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        with counting_layer_runs(model) as runs:
            model(ids, labels=ids).loss.backward()
        assert runs == [2 if checkpointing else 1] * model.config.num_hidden_layers  # backward recomputed each layer
        return {name: p.grad for name, p in model.named_parameters()}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain["model.layers.1.router.value_route_query"].abs().sum() > 0
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_save_load_keeps_routes_and_initialises_missing_ones(tmp_path):
    model = randomize_routes(tiny_model("rd_attnres"))
    ids = random_ids(2, 8)
    model.save_pretrained(tmp_path)
    reloaded = RdAttnResForCausalLM.from_pretrained(tmp_path)
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)

    # a checkpoint without the routing parameters: from_pretrained must give zero queries and unit key
    # norms (not the uninitialised memory transformers materialises missing weights with)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "route_" not in k}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    partial = RdAttnResForCausalLM.from_pretrained(tmp_path)
    for name, parameter in partial.named_parameters():
        if "route_query" in name:
            assert torch.equal(parameter, torch.zeros_like(parameter)), name
        elif "route_key_norm" in name:
            assert torch.equal(parameter, torch.ones_like(parameter)), name


def llama(seed=0, **overrides):
    torch.manual_seed(seed)
    fields = {k: v for k, v in TINY.items()}
    return LlamaForCausalLM(LlamaConfig(**{**fields, **overrides})).eval()


def test_convert_llama_to_attnres_and_rd_attnres():
    """Llama -> attnres: zero queries, same logits up to the RMSNorm ε effect (ε = 1e-10 here: 1e-5);
    attnres -> rd_attnres: the V route starts as a copy of the Q/K route, identical logits."""
    source = llama(rms_norm_eps=1e-10)
    ids = random_ids(2, 10)
    attnres = convert(source, "attnres")
    assert isinstance(attnres, AttnResForCausalLM) and attnres.config.attnres_block_size == 4
    with torch.no_grad():
        torch.testing.assert_close(attnres(ids).logits, source(ids).logits, rtol=1e-5, atol=1e-5)

    randomize_routes(attnres)  # as after training
    rd = convert(attnres, "rd_attnres")
    assert isinstance(rd, RdAttnResForCausalLM) and rd.config.value_route == "learned"
    with torch.no_grad():
        torch.testing.assert_close(rd(ids).logits, attnres(ids).logits, rtol=0, atol=1e-5)
    assert torch.equal(rd.model.layers[2].router.value_route_query, attnres.model.layers[2].router.attn_route_query)
    with pytest.raises(ValueError, match="value_route='frozen'"):
        attnres_to_rd_attnres(attnres, value_route="frozen")
    with pytest.raises(ValueError, match="depth_routing='standard'"):
        convert(rd, "attnres")


def test_convert_script_llama_to_rd_attnres(tmp_path):
    source = llama(rms_norm_eps=1e-10, tie_word_embeddings=True)
    source.save_pretrained(tmp_path / "llama")
    convert_main(["--input", str(tmp_path / "llama"), "--output", str(tmp_path / "rd"), "--to", "rd_attnres"])
    converted = RdAttnResForCausalLM.from_pretrained(tmp_path / "rd")
    ids = random_ids(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, source(ids).logits, rtol=1e-5, atol=1e-5)
    assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()


def test_trainer_logs_depth_diagnostics(tmp_path):
    model = tiny_model("rd_attnres").train()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=1e-2, use_cpu=True, report_to=[], logging_steps=2, save_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=RepeatedSequences(),
                      callbacks=[DepthRouteLoggingCallback()])
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert {f"depth/layer_{i}/qk_value_js" for i in range(3)} <= set(entry)
        assert 0 <= entry["depth/mean_qk_value_js"] <= torch.log(torch.tensor(2.0)).item()
        assert 0 < entry["depth/layer_0/attention_qk_embedding_weight"] <= 1
    # the learned value route has moved away from the Q/K route (both start at zero: JS 0 at step 0)
    assert logged[-1]["depth/mean_qk_value_js"] > 0
    assert not model.model.layers[0].router.record_routes  # switched off at the end of training


def test_bfloat16_training_step():
    model = randomize_routes(tiny_model("rd_attnres"), scale=0.5).to(torch.bfloat16).train()
    ids = random_ids(2, 8)
    loss = model(ids, labels=ids).loss
    loss.backward()
    router = model.model.layers[1].router
    assert router.value_route_query.grad.dtype == torch.bfloat16 and router.value_route_query.grad.abs().sum() > 0
    with torch.no_grad():
        reference = randomize_routes(tiny_model("rd_attnres"), scale=0.5)(ids, labels=ids).loss
    assert abs(loss.item() - reference.item()) < 0.05


def test_composes_with_value_paths_and_model_diagnostics():
    """RD-AttnRes with SATFormer-style V1 gates: decode = prefill, and `valuearch_diagnostics()` collects
    the routers' and readout's reports next to the value paths'."""
    model = randomize_routes(tiny_model("rd_attnres", value_source="v1", value_mix="relu_gate",
                                        value_coefficients="learnable", value_layers="all"), scale=0.5)
    ids = random_ids(2, 10)
    record_depth_routes(model)
    with torch.no_grad():
        full = model(ids).logits
        report = model.valuearch_diagnostics()
        out = model(ids[:, :6], use_cache=True)
        steps, cache = [out.logits], output_cache(out)
        for t in range(6, 10):
            steps.append(model(ids[:, t : t + 1], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert report["model.layers.1.router"]["qk_value_js"] > 0
    assert len(report["model.readout"]["final"]) == 3  # embedding, one completed block, the partial sum
    assert "model.layers.1.self_attn.value_path" in report


def test_composes_with_kvm_layers():
    """RD-AttnRes routing around KVM sequence mixers: decode = prefill (depth mixing is per token)."""
    model = randomize_routes(tiny_model("rd_attnres", mixer_types=["kvm"] * 3, kvm_chunk_size=4,
                                        kvm_state_min_slots=4, kvm_state_max_chunks=4, kvm_zero_state_rope=False),
                             scale=0.5)
    full, stepped = prefill_then_decode(model, random_ids(2, 14), 6)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)
