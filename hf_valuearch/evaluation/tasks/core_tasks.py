"""DCLM CORE (Li et al. 2024, arXiv:2406.11794): its 22 tasks as lm-eval tasks over the llm-foundry ICL files.

lm-eval loads this file from the task folder (`!function core_tasks.NAME`), so it imports nothing from
hf_valuearch: the tasks run wherever lm-eval runs, with the model taken from a checkpoint's own code.

Prompts, few-shot sampling and scoring follow nanochat's `core_eval.py`, the reference for CORE:
the data is shuffled with `Random(1337)` (so `--limit N` takes a fixed subsample), item `i` gets its few-shot
examples from `Random(1234 + i).sample(other items, k)`, prompts start with BOS, and

- multiple choice: the choices share the prompt up to the first token where they differ; the choice with the
  lowest mean per-token loss from that token on wins;
- schema: the contexts differ and share a token suffix; the context with the lowest mean loss on it wins;
- language modeling: correct iff every continuation token is the greedy (argmax) prediction.

Each document carries the text split lm-eval scores (`context` / `choices`, or `contexts` / `continuation`) and,
for multiple choice and schema, `n_tokens`: how many tokens lm-eval scores for each option, so that
`process_choices` turns lm-eval's summed log-likelihoods into the reference's mean losses.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import NamedTuple

import datasets
from transformers import AutoTokenizer


class CoreTask(NamedTuple):
    path: str  # relative to the data dir: llm-foundry's scripts/eval/local_data layout
    kind: str  # "multiple_choice" | "schema" | "language_modeling"
    shots: int
    delimiter: str  # continuation delimiter
    random_baseline: float  # percent; DCLM eval/eval_meta_data.csv (v2)


_ANSWER = "\nAnswer: "
# DCLM eval/additional_aggregation.json "low_variance_datasets", shots from eval/mmlu_and_lowvar.yaml.
CORE_TASKS = {
    "hellaswag_zeroshot": CoreTask("language_understanding/hellaswag.jsonl", "multiple_choice", 0, " ", 25.0),
    "jeopardy": CoreTask("world_knowledge/jeopardy_all.jsonl", "language_modeling", 10, _ANSWER, 0.0),
    "bigbench_qa_wikidata": CoreTask("world_knowledge/bigbench_qa_wikidata.jsonl", "language_modeling", 10, " ", 0.0),
    "arc_easy": CoreTask("world_knowledge/arc_easy.jsonl", "multiple_choice", 10, _ANSWER, 25.0),
    "arc_challenge": CoreTask("world_knowledge/arc_challenge.jsonl", "multiple_choice", 10, _ANSWER, 25.0),
    "copa": CoreTask("commonsense_reasoning/copa.jsonl", "multiple_choice", 0, " ", 50.0),
    "commonsense_qa": CoreTask("commonsense_reasoning/commonsense_qa.jsonl", "multiple_choice", 10, " ", 40.3),
    "piqa": CoreTask("commonsense_reasoning/piqa.jsonl", "multiple_choice", 10, _ANSWER, 50.0),
    "openbook_qa": CoreTask("commonsense_reasoning/openbook_qa.jsonl", "multiple_choice", 0, " ", 25.0),
    "lambada_openai": CoreTask("language_understanding/lambada_openai.jsonl", "language_modeling", 0, " ", 0.0),
    "hellaswag": CoreTask("language_understanding/hellaswag.jsonl", "multiple_choice", 10, " ", 25.0),
    "winograd": CoreTask("language_understanding/winograd_wsc.jsonl", "schema", 0, " ", 50.0),
    "winogrande": CoreTask("language_understanding/winogrande.jsonl", "schema", 0, " ", 50.0),
    "bigbench_dyck_languages": CoreTask("symbolic_problem_solving/bigbench_dyck_languages.jsonl", "language_modeling",
                                        10, " ", 0.0),
    "agi_eval_lsat_ar": CoreTask("symbolic_problem_solving/agi_eval_lsat_ar.jsonl", "multiple_choice", 3, " ", 25.0),
    "bigbench_cs_algorithms": CoreTask("symbolic_problem_solving/bigbench_cs_algorithms.jsonl", "language_modeling",
                                       10, " ", 0.0),
    "bigbench_operators": CoreTask("symbolic_problem_solving/bigbench_operators.jsonl", "language_modeling", 10, " ",
                                   0.0),
    "bigbench_repeat_copy_logic": CoreTask("symbolic_problem_solving/bigbench_repeat_copy_logic.jsonl",
                                           "language_modeling", 10, " ", 0.0),
    "squad": CoreTask("reading_comprehension/squad.jsonl", "language_modeling", 10, " ", 0.0),
    "coqa": CoreTask("reading_comprehension/coqa.jsonl", "language_modeling", 0, " ", 0.0),
    "boolq": CoreTask("reading_comprehension/boolq.jsonl", "multiple_choice", 10, _ANSWER, 62.0),
    "bigbench_language_identification": CoreTask("language_understanding/bigbench_language_identification.jsonl",
                                                 "multiple_choice", 10, " ", 25.0),
}
ITEM_KEYS = {  # what each line of a task file must hold
    "multiple_choice": {"query": str, "choices": list, "gold": int},
    "schema": {"context_options": list, "continuation": str, "gold": int},
    "language_modeling": {"context": str, "continuation": str},
}


def read_items(path: Path, kind: str) -> list[dict]:
    """The items of one ICL jsonl file; ValueError naming the file, the line and the keys expected."""
    expected = ", ".join(f"{key!r} ({kind_.__name__})" for key, kind_ in ITEM_KEYS[kind].items())
    items = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg}); each line must be a JSON object "
                             f"with {expected}") from None
        if not isinstance(item, dict) or any(not isinstance(item.get(key), type_)
                                             for key, type_ in ITEM_KEYS[kind].items()):
            raise ValueError(f"{path}:{number}: a {kind} item needs {expected}, got {line[:120]!r}")
        items.append(item)
    if not items:
        raise ValueError(f"{path}: holds no items; each line must be a JSON object with {expected}")
    return items


def render_prompts(kind: str, item: dict, fewshot: list[dict], delimiter: str) -> list[str]:
    """The reference's full prompts: one per choice (multiple choice), one per context option (schema), or
    [prompt without, prompt with] the continuation (language modeling)."""
    if kind == "multiple_choice":
        shots = "".join(f"{ex['query']}{delimiter}{ex['choices'][ex['gold']]}\n\n" for ex in fewshot)
        return [f"{shots}{item['query']}{delimiter}{choice}" for choice in item["choices"]]
    if kind == "schema":
        shots = "".join(f"{ex['context_options'][ex['gold']]}{delimiter}{ex['continuation']}\n\n" for ex in fewshot)
        return [f"{shots}{option}{delimiter}{item['continuation']}" for option in item["context_options"]]
    shots = "".join(f"{ex['context'].strip()}{delimiter}{ex['continuation']}\n\n" for ex in fewshot)
    body = f"{shots}{item['context'].strip()}{delimiter}".lstrip()
    return [body.rstrip(), body + item["continuation"]]


def _common_length(sequences: list[list[int]], from_end: bool) -> int:
    """Length of the token prefix (or suffix) that all sequences share."""
    if from_end:
        sequences = [sequence[::-1] for sequence in sequences]
    length = 0
    for tokens in zip(*sequences):
        if any(token != tokens[0] for token in tokens):
            break
        length += 1
    return length


def _scored_tokens(tokenizer, context: str, continuation: str) -> int:
    """How many continuation tokens lm-eval's HFLM scores for this pair (its `_encode_pair` split)."""
    spaces = len(context) - len(context.rstrip())
    context, continuation = context[: len(context) - spaces], context[len(context) - spaces:] + continuation
    return len(tokenizer(context + continuation)["input_ids"]) - len(tokenizer(context)["input_ids"])


def make_document(kind: str, prompts: list[str], gold: int, tokenizer) -> dict:
    """The lm-eval document of one item: the prompts split at the token where the reference starts scoring."""
    bos = tokenizer.bos_token or ""
    if kind == "language_modeling":
        without, with_continuation = prompts
        return {"context": bos + without, "continuation": with_continuation[len(without):]}
    encoded = tokenizer(prompts, add_special_tokens=False, return_offsets_mapping=True)
    # every option keeps at least one scored token (the reference would average an empty span to NaN)
    common = min(_common_length(encoded["input_ids"], from_end=kind == "schema"),
                 min(len(ids) for ids in encoded["input_ids"]) - 1)
    if kind == "multiple_choice":
        cut = encoded["offset_mapping"][0][common - 1][1] if common else 0
        context, choices = bos + prompts[0][:cut], [prompt[cut:] for prompt in prompts]
        return {"context": context, "choices": choices, "gold": gold,
                "n_tokens": [_scored_tokens(tokenizer, context, choice) for choice in choices]}
    cuts = [offsets[len(offsets) - common][0] for offsets in encoded["offset_mapping"]]
    contexts, continuation = [bos + prompt[:cut] for prompt, cut in zip(prompts, cuts)], prompts[0][cuts[0]:]
    return {"contexts": contexts, "continuation": continuation, "gold": gold,
            "n_tokens": [_scored_tokens(tokenizer, context, continuation) for context in contexts]}


def load_core_task(core_task: str, core_data_dir: str | None = None, tokenizer: str | None = None,
                   pretrained: str | None = None, **_metadata) -> dict[str, datasets.Dataset]:
    """lm-eval `custom_dataset`: the documents of CORE task `core_task`, read from `core_data_dir`, prompts sized
    with the model's tokenizer (metadata `tokenizer`, else `pretrained`)."""
    task = CORE_TASKS[core_task]
    if not core_data_dir:
        raise ValueError(f"CORE task {core_task!r} needs the DCLM / llm-foundry ICL files: pass --metadata "
                         "'{\"core_data_dir\": \"DIR\"}' with DIR holding llm-foundry's scripts/eval/local_data")
    path = Path(core_data_dir) / task.path
    if not path.is_file():
        raise FileNotFoundError(f"CORE task {core_task!r} expects its data file at {path}")
    name = tokenizer or pretrained
    if not isinstance(name, str) or not name:
        raise ValueError("CORE tasks size prompts with the model's tokenizer: pass model_args pretrained=DIR "
                         "or metadata tokenizer=DIR")
    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=True)
    items = read_items(path, task.kind)
    random.Random(1337).shuffle(items)
    documents = []
    for index, item in enumerate(items):
        others = [i for i in range(len(items)) if i != index]
        fewshot = [items[i] for i in random.Random(1234 + index).sample(others, task.shots)] if task.shots else []
        prompts = render_prompts(task.kind, item, fewshot, task.delimiter)
        documents.append(make_document(task.kind, prompts, item.get("gold", 0), tokenizer))
    return {"test": datasets.Dataset.from_list(documents)}


def process_choices(doc: dict, results: list[tuple[float, bool]]) -> dict[str, float]:
    """Multiple choice and schema: the option with the lowest mean per-token loss (highest mean log-likelihood)."""
    mean_loglikelihoods = [loglikelihood / n for (loglikelihood, _), n in zip(results, doc["n_tokens"])]
    prediction = max(range(len(mean_loglikelihoods)), key=mean_loglikelihoods.__getitem__)
    return {"acc": float(prediction == doc["gold"])}
