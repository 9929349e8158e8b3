"""Corpora for pretraining, streamed: documents -> batched tokenisation -> blocks packed with EOS between documents.

Sources (`--data`):

* nothing: the embedded default corpus, text that ships with Python itself (`default_corpus_documents`);
* a local file or folder of `.txt/.md/.rst/.text` (one document per blank-line-separated paragraph),
  `.jsonl/.json` (one document per row, its `text` field) or `.parquet` (its `text` column) files;
* `hf:NAME[:CONFIG]`: a Hub dataset, streamed (its `train` split, `text` column).

Every source goes through `datasets` in streaming mode, so no corpus is ever held in memory whole. The held-out
split is deterministic: every `EVAL_EVERY`-th document (by position in the stream) is held out, and the eval set
is the first `eval_blocks` blocks packed from those documents.
"""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
DATA_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
EVAL_EVERY = 50  # document i is held out when i % EVAL_EVERY == 0
DEFAULT_CORPUS = "the embedded default corpus (Python's pydoc topics and standard-library docstrings)"
_STDLIB_SKIPPED = {"site-packages", "dist-packages", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}


def default_corpus_documents() -> Iterator[str]:
    """Text that ships with every Python: the pydoc help topics (sorted by name), then one document per
    standard-library module holding its module, class and function docstrings (modules sorted by path; tests,
    IDLE, Tk and installed packages skipped). Deterministic for a given Python version, about 2 MB for 3.11."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield topics[name]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).parts
        if any(part in _STDLIB_SKIPPED or part.startswith("test") or part.startswith("config-") for part in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        docstrings = [ast.get_docstring(node) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        text = "\n\n".join(doc for doc in docstrings if doc)
        if text:
            yield text


def _check_readable_text(path: Path):
    """A clear error for a file that cannot be read or is not text (a NUL byte or invalid UTF-8 at its start)."""
    try:
        with open(path, "rb") as file:
            head = file.read(1 << 16)
    except OSError as error:
        raise ValueError(f"--data file {str(path)!r} cannot be read ({error.strerror})") from None
    if path.suffix in PARQUET_SUFFIXES:
        if head[:4] != b"PAR1":
            raise ValueError(f"--data file {str(path)!r} is not a parquet file (no PAR1 header)")
        return
    if b"\x00" in head:
        raise ValueError(f"--data file {str(path)!r} is binary (it contains NUL bytes); expected UTF-8 text "
                         f"files with suffixes {list(DATA_SUFFIXES)}")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not merely a character cut at the end of the sample
            raise ValueError(f"--data file {str(path)!r} is not UTF-8 text (invalid byte at offset "
                             f"{error.start}); expected UTF-8 text files") from None


def local_files(data: str) -> list[Path]:
    """The data files of a local file or folder, checked to be readable text / parquet, sorted by path."""
    path = Path(data)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"--data {data!r} holds no data files (suffixes {list(DATA_SUFFIXES)})")
    else:
        raise FileNotFoundError(f"--data {data!r} is neither a file, a directory nor hf:NAME[:CONFIG]")
    for file in files:
        if file.suffix not in DATA_SUFFIXES:
            raise ValueError(f"--data file {str(file)!r} has suffix {file.suffix!r}; allowed: {list(DATA_SUFFIXES)}")
        _check_readable_text(file)
    return files


def _stream(builder: str, files: list[Path], **options):
    from datasets import load_dataset

    return load_dataset(builder, data_files=[str(f) for f in files], split="train", streaming=True, **options)


def open_corpus(data: str | None):
    """A `datasets.IterableDataset` of documents (a `text` column) for `--data` (see the module docstring)."""
    from datasets import IterableDataset, concatenate_datasets

    if data is None:
        return IterableDataset.from_generator(lambda: ({"text": text} for text in default_corpus_documents()))
    if data.startswith("hf:"):
        from datasets import load_dataset

        name, _, config_name = data[3:].partition(":")
        try:
            return load_dataset(name, config_name or None, split="train", streaming=True)
        except (ConnectionError, OSError) as error:
            raise RuntimeError(f"could not stream Hub dataset {name!r} ({error}). Without network access, pass a "
                               "local text file or directory instead.") from error
    files = local_files(data)
    parts = []
    for suffixes, builder, options in ((TEXT_SUFFIXES, "text", {"sample_by": "paragraph", "chunksize": 1 << 20}),
                                       (JSON_SUFFIXES, "json", {}), (PARQUET_SUFFIXES, "parquet", {})):
        chosen = [f for f in files if f.suffix in suffixes]
        if chosen:
            parts.append(_stream(builder, chosen, **options).select_columns(["text"]))
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def iter_texts(data: str | None) -> Iterator[str]:
    """The documents of `--data`, streamed; a clear error when the source has no `text` column."""
    try:
        for row in open_corpus(data):
            yield row["text"]
    except KeyError:
        raise ValueError(f"--data {data!r} has no 'text' column") from None
    except (ConnectionError, OSError) as error:
        if data is not None and data.startswith("hf:"):
            raise RuntimeError(f"could not stream Hub dataset {data[3:]!r} ({error}). Without network access, "
                               "pass a local text file or directory instead.") from error
        raise


def training_texts(data: str | None, max_chars: int) -> Iterator[str]:
    """The training documents (held-out ones excluded), up to `max_chars` characters: the tokenizer's sample.
    Raises ValueError when the corpus holds no text at all."""
    seen = 0
    for index, text in enumerate(iter_texts(data)):
        if index % EVAL_EVERY == 0 or not text.strip():
            continue
        yield text[: max_chars - seen]
        seen += len(text)
        if seen >= max_chars:
            return
    if seen == 0:
        raise ValueError(f"--data {data!r} holds no text: every document is empty or held out for evaluation "
                         f"(documents 0, {EVAL_EVERY}, ...); give a corpus with at least two non-empty documents")


class PackedStream(torch.utils.data.IterableDataset):
    """Blocks of `block_size` tokens packed from the train (or held-out) documents of a corpus, EOS after each
    document; tokenised in batches of `batch_documents`. Only the current batch and one partial block are in
    memory. The held-out stream stops after `max_blocks` blocks."""

    def __init__(self, data: str | None, tokenizer, block_size: int, held_out: bool,
                 max_blocks: int | None = None, batch_documents: int = 256):
        self.data, self.tokenizer, self.block_size = data, tokenizer, block_size
        self.held_out, self.max_blocks, self.batch_documents = held_out, max_blocks, batch_documents

    def _documents(self) -> Iterator[list[str]]:
        batch = []
        for index, text in enumerate(iter_texts(self.data)):
            if (index % EVAL_EVERY == 0) == self.held_out and text.strip():
                batch.append(text)
                if len(batch) == self.batch_documents:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def __iter__(self):
        eos, buffer, count = self.tokenizer.eos_token_id, [], 0
        for batch in self._documents():
            for ids in self.tokenizer(batch, add_special_tokens=False)["input_ids"]:
                buffer.extend(ids)
                buffer.append(eos)
                while len(buffer) >= self.block_size:
                    block = torch.tensor(buffer[: self.block_size], dtype=torch.long)
                    del buffer[: self.block_size]
                    yield {"input_ids": block, "labels": block}
                    count += 1
                    if self.max_blocks is not None and count >= self.max_blocks:
                        return


class HeldOutBlocks(torch.utils.data.Dataset):
    """The held-out blocks, materialised (at most `max_blocks` of them): a fixed eval set."""

    def __init__(self, stream: PackedStream):
        self.blocks = [item["input_ids"] for item in stream]
        if not self.blocks:
            raise ValueError(f"--data {stream.data!r} is too small for one held-out block of {stream.block_size} "
                             f"tokens (documents 0, {EVAL_EVERY}, ... are held out); give more text or a smaller "
                             "--block_size")

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, index):
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}
