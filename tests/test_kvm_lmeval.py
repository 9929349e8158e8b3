"""lm-eval batching on a KVM model: batched requests give the results of one request at a time.

loglikelihood batches are right-padded (causal: padding after a sequence cannot change it); generate_until
batches are left-padded with an attention mask, which KVM layers run one sequence at a time (kvm.py).
"""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from tests.common import tiny_model

lm_eval_huggingface = pytest.importorskip("lm_eval.models.huggingface")
from lm_eval.api.instance import Instance  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

CORPUS = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
          "all that glitters is not gold"] * 5


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A 97-token BPE (the tiny models' vocabulary) with <pad>=0, <s>=1, </s>=2."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=97,
                                                              special_tokens=["<pad>", "<s>", "</s>", "<unk>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def test_batched_requests_match_single_requests():
    model = tiny_model("kvm", kvm_chunk_size=4, kvm_state_min_slots=4)
    tokenizer = tiny_tokenizer()
    contexts = ["the quick brown fox jumps over the", "a stitch",
                "all that glitters is not gold and the quick brown fox"]  # 3 lengths, several chunks of 4
    loglikelihood = [Instance("loglikelihood", {}, (c, " lazy dog"), i) for i, c in enumerate(contexts)]
    generation = [Instance("generate_until", {}, (c, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}), i)
                  for i, c in enumerate(contexts)]
    results = {}
    for batch_size in (1, 3):
        lm = lm_eval_huggingface.HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device="cpu")
        results[batch_size] = (lm.loglikelihood(loglikelihood), lm.generate_until(generation))
    for (single, _), (batched, _) in zip(results[1][0], results[3][0]):
        assert batched == pytest.approx(single, abs=1e-5)
    assert results[3][1] == results[1][1]
