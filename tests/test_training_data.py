"""The data pipeline (hf_valuearch/training/data.py): the embedded default corpus, local text / jsonl / parquet
sources, packing with EOS, the held-out split, and a corpus far larger than the memory a run uses."""

import json
import random
from itertools import islice
import subprocess
import sys

import pytest

from hf_valuearch.training import train_tokenizer
from hf_valuearch.training.data import EVAL_EVERY, PackedStream, default_corpus_documents, iter_texts
from tests.common import REPO


@pytest.mark.slow
def test_default_corpus_is_deterministic_and_big_enough():
    documents = list(default_corpus_documents())
    assert list(islice(default_corpus_documents(), 150)) == documents[:150]
    assert sum(len(text) for text in documents) > 1_000_000 and len(documents) > 500


def test_text_jsonl_and_parquet_sources(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("first paragraph\nstill first\n\nsecond paragraph\n")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": f"row {i}", "id": i}) for i in range(3)))
    pq.write_table(pa.table({"text": ["parquet one", "parquet two"]}), tmp_path / "c.parquet")
    texts = [text.strip() for text in iter_texts(str(tmp_path))]
    assert texts == ["first paragraph\nstill first", "second paragraph", "row 0", "row 1", "row 2",
                     "parquet one", "parquet two"]


def test_blocks_are_packed_with_eos_and_the_held_out_documents_stay_out(tmp_path):
    documents = [f"document number {i} " + "word " * (i % 7) for i in range(2 * EVAL_EVERY + 5)]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in documents))
    tokenizer = train_tokenizer(documents, 300)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    expected = {True: [], False: []}
    for index, text in enumerate(documents):
        expected[index % EVAL_EVERY == 0] += [*encode(text), tokenizer.eos_token_id]
    for held_out in (True, False):
        blocks = [item["input_ids"].tolist() for item in
                  PackedStream(str(tmp_path / "docs.jsonl"), tokenizer, 8, held_out=held_out, batch_documents=4)]
        stream = [token for block in blocks for token in block]
        assert all(len(block) == 8 for block in blocks)
        assert stream == expected[held_out][: len(stream)] and len(expected[held_out]) - len(stream) < 8


def peak_rss_of_a_run(tmp_path, data, tokenizer) -> int:
    """Peak RSS (bytes) of a 2-step training run on `data`, measured in its own process."""
    script = f"""
import resource, sys
sys.argv = ["train.py", "--config", "valuearch", "--data", {str(data)!r}, "--tokenizer", {str(tokenizer)!r},
            "--output_dir", {str(tmp_path / ("run_" + data.stem))!r}, "--max_steps", "2", "--block_size", "64",
            "--disable_tqdm", "true", "--save_strategy", "no", "--set", "vocab_size=300"]
import runpy
runpy.run_path({str(REPO / "scripts" / "train.py")!r}, run_name="__main__")
print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.split("PEAK")[-1]) * 1024  # ru_maxrss is in KiB on Linux


@pytest.mark.slow
def test_a_corpus_larger_than_the_memory_bound_streams(tmp_path):
    """A 48 MB text file trains with the peak memory of a 30 kB one (+ 30 MB slack): nothing holds it whole."""
    words = "value bank token layer depth residual attention window state mean query key".split()
    rng = random.Random(0)
    paragraph = "\n".join(" ".join(rng.choice(words) for _ in range(16)) for _ in range(8)) + "\n\n"
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text(paragraph * 60)
    with open(large, "w") as file:
        for _ in range(60_000):
            file.write(paragraph)
    assert large.stat().st_size > 40e6
    tokenizer = train_tokenizer([paragraph], 300)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    small_peak = peak_rss_of_a_run(tmp_path, small, tmp_path / "tokenizer")
    large_peak = peak_rss_of_a_run(tmp_path, large, tmp_path / "tokenizer")
    assert large_peak < small_peak + 30e6, (small_peak, large_peak)
