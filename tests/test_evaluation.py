"""Evaluation: DCLM CORE scoring checked against a direct computation from the model's logits, RULER / NIAH
generators sized with the model's tokenizer, summaries and plots, scripts/evaluate.py per suite and its errors,
left-padded lm-eval batches for every architecture, and lm-eval's command line on a trust_remote_code checkpoint
where hf_valuearch is not importable."""

from __future__ import annotations

import json
import os
import random
import re
import runpy
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from hf_valuearch import MODEL_TYPES
from hf_valuearch.evaluation import TASK_DIR
from hf_valuearch.evaluation.summary import centered_accuracy, core_summary, grid_scores, niah_markdown
from hf_valuearch.evaluation.tasks import ruler_tasks
from hf_valuearch.evaluation.tasks.core_tasks import CORE_TASKS
from hf_valuearch.training import train_tokenizer
from tests.common import run_script, tiny_model

WORDS = ("the cat dog sat on a mat red blue green house tree river quickly slowly ran jumped over under big small "
         "old new bird fish sun moon").split()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny baseline model and a 1000-token byte-level BPE (trained on the RULER texts), saved together."""
    path = tmp_path_factory.mktemp("model")
    texts = [ruler_tasks.ESSAY, ruler_tasks.REPEAT, ruler_tasks.NIAH_TEMPLATE, ruler_tasks.NEEDLE,
             " ".join(ruler_tasks.WORDS[::5]), " ".join(WORDS)] * 3
    tokenizer = train_tokenizer(texts, 1000)
    model = tiny_model("valuearch", vocab_size=len(tokenizer), max_position_embeddings=2048)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_jsonl(path: Path, items: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in items))


# ---------------------------------------------------------------- CORE against a direct computation


def reference_prompts(kind: str, item: dict, shots: list[dict], delimiter: str) -> list[str]:
    """nanochat core_eval.py's templates, written out for the test."""
    if kind == "multiple_choice":
        head = "".join(s["query"] + delimiter + s["choices"][s["gold"]] + "\n\n" for s in shots)
        return [head + item["query"] + delimiter + c for c in item["choices"]]
    if kind == "schema":
        head = "".join(s["context_options"][s["gold"]] + delimiter + s["continuation"] + "\n\n" for s in shots)
        return [head + c + delimiter + item["continuation"] for c in item["context_options"]]
    head = "".join(s["context"].strip() + delimiter + s["continuation"] + "\n\n" for s in shots)
    without = (head + item["context"].strip() + delimiter).strip()
    return [without, (head + item["context"].strip() + delimiter).lstrip() + item["continuation"]]


def direct_scores(model, tokenizer, kind: str, prompts: list[str]):
    """Mean losses per option (multiple choice, schema) or greedy correctness (language modeling), computed from
    the logits of [BOS] + tokens, scoring from the first differing token (prefix) or the shared suffix."""
    sequences = [[tokenizer.bos_token_id] + tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if kind == "language_modeling":
        without, with_continuation = sequences
        assert with_continuation[: len(without)] == without
        ids = torch.tensor([with_continuation])
        with torch.no_grad():
            predictions = model(ids).logits[0].argmax(-1)
        return bool(torch.equal(predictions[len(without) - 1 : -1], ids[0, len(without):]))
    if kind == "multiple_choice":
        start = next((i for i in range(min(map(len, sequences))) if len({s[i] for s in sequences}) > 1),
                     min(map(len, sequences)))
        spans = [(start, len(s)) for s in sequences]
    else:
        suffix = next(i for i in range(1, min(map(len, sequences)) + 1) if len({s[-i] for s in sequences}) > 1) - 1
        spans = [(len(s) - suffix, len(s)) for s in sequences]
    losses = []
    for sequence, (start, end) in zip(sequences, spans):
        with torch.no_grad():
            logits = model(torch.tensor([sequence])).logits[0]
        token_losses = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(sequence[1:]), reduction="none")
        losses.append(token_losses[start - 1 : end - 1].mean().item())
    return losses


@pytest.fixture(scope="module")
def core_data(tmp_path_factory, model_dir):
    """Small files in each CORE format: copa (MC 0-shot), arc_easy (MC 10-shot, choices sharing words),
    winogrande (schema), lambada_openai (LM 0-shot, half the continuations the model's own greedy tokens),
    jeopardy (LM 10-shot)."""
    from transformers import AutoTokenizer

    root, rng = tmp_path_factory.mktemp("core_data"), random.Random(0)
    model = tiny_model("valuearch", vocab_size=1000, max_position_embeddings=2048)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    write_jsonl(root / CORE_TASKS["copa"].path, [
        {"query": sentence(rng, 6), "choices": [sentence(rng, 3), sentence(rng, 2)], "gold": rng.randrange(2)}
        for _ in range(6)])
    write_jsonl(root / CORE_TASKS["arc_easy"].path, [
        {"query": sentence(rng, 5), "gold": rng.randrange(3),
         "choices": ["the " + sentence(rng, 2), "the " + sentence(rng, 3), "a " + sentence(rng, 1)]}
        for _ in range(12)])
    write_jsonl(root / CORE_TASKS["winogrande"].path, [
        {"context_options": [sentence(rng, 4), sentence(rng, 5)], "continuation": sentence(rng, 3),
         "gold": rng.randrange(2)} for _ in range(6)])
    lambada = []
    for index in range(6):
        context = sentence(rng, 8)
        continuation = sentence(rng, 2)
        if index % 2:  # the model's own two greedy tokens after the prompt: correct unless retokenized differently
            ids = [tokenizer.bos_token_id] + tokenizer(context)["input_ids"]
            with torch.no_grad():
                for _ in range(2):
                    ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            continuation = tokenizer.decode(ids[-2:], skip_special_tokens=True).lstrip(" ") or continuation
        lambada.append({"context": context + " ", "continuation": continuation})
    write_jsonl(root / CORE_TASKS["lambada_openai"].path, lambada)
    write_jsonl(root / CORE_TASKS["jeopardy"].path, [
        {"context": sentence(rng, 5), "continuation": sentence(rng, 1), "category": "x"} for _ in range(12)])
    return root, model, tokenizer


@pytest.mark.slow
def test_core_tasks_score_as_the_direct_computation(core_data, model_dir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    root, model, tokenizer = core_data
    names = ["copa", "arc_easy", "winogrande", "lambada_openai", "jeopardy"]
    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False,
                          metadata={"core_data_dir": str(root), "pretrained": str(model_dir)})
    out = simple_evaluate(model=HFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, device="cpu"),
                          tasks=[f"core_{name}" for name in names], task_manager=manager, log_samples=True)
    greedy_hits = 0
    for name in names:
        task = CORE_TASKS[name]
        items = [json.loads(line) for line in (root / task.path).read_text().splitlines()]
        random.Random(1337).shuffle(items)
        samples = sorted(out["samples"][f"core_{name}"], key=lambda sample: sample["doc_id"])
        assert len(samples) == len(items)
        correct = []
        for index, (item, sample) in enumerate(zip(items, samples)):
            others = [i for i in range(len(items)) if i != index]
            shots = [items[i] for i in random.Random(1234 + index).sample(others, task.shots)]
            expected = direct_scores(model, tokenizer, task.kind, reference_prompts(task.kind, item, shots,
                                                                                    task.delimiter))
            if task.kind == "language_modeling":
                assert sample["acc"] == float(expected)
                greedy_hits += expected
                correct.append(expected)
            else:
                loglikelihoods = [response[0][0] for response in sample["resps"]]
                mean_losses = [-ll / n for ll, n in zip(loglikelihoods, sample["doc"]["n_tokens"])]
                assert mean_losses == pytest.approx(expected, abs=1e-4)
                correct.append(min(range(len(expected)), key=expected.__getitem__) == item["gold"])
                assert sample["acc"] == float(correct[-1])
        assert out["results"][f"core_{name}"]["acc,none"] == pytest.approx(sum(correct) / len(correct))
    assert greedy_hits > 0  # the language-modeling check saw correct items, not only misses


def test_core_score_aggregates_centered_accuracies():
    accuracies = {name: 0.1 + 0.03 * i for i, name in enumerate(CORE_TASKS)}
    summary, score = core_summary(accuracies)
    by_hand = {name: (acc - CORE_TASKS[name].random_baseline / 100) / (1 - CORE_TASKS[name].random_baseline / 100)
               for name, acc in accuracies.items()}
    assert {name: entry["centered_acc"] for name, entry in summary.items()} == pytest.approx(by_hand)
    assert score == pytest.approx(sum(by_hand.values()) / 22)
    assert len(CORE_TASKS) == 22 and centered_accuracy(0.62, 62.0) == 0.0
    assert CORE_TASKS["commonsense_qa"].random_baseline == 40.3 and CORE_TASKS["boolq"].random_baseline == 62.0


def test_task_folder_declares_every_core_task(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["python -m hf_valuearch.evaluation", "--task-dir"])
    runpy.run_module("hf_valuearch.evaluation", run_name="__main__")
    assert capsys.readouterr().out.strip() == str(TASK_DIR)
    core_yamls = {p.stem for p in TASK_DIR.glob("core_*.yaml")}
    assert core_yamls == {f"core_{name}" for name in CORE_TASKS}
    group = (TASK_DIR / "core.yaml").read_text()
    assert all(f"- core_{name}\n" in group for name in CORE_TASKS)


# ---------------------------------------------------------------- RULER and NIAH generators


def ruler_tokens(tokenizer, document) -> int:
    return len(tokenizer(document["input"] + " " + document["gen_prefix"])["input_ids"])


@pytest.mark.parametrize("task", [*ruler_tasks.NIAH_TASKS, "vt", "cwe", "fwe"])
def test_ruler_generators_fill_each_length_with_the_models_tokenizer(task, model_dir):
    lengths, budget = [1024, 2048], ruler_tasks.GEN_TOKENS["niah" if task.startswith("niah") else task]
    documents = ruler_tasks.generate(task, {"pretrained": str(model_dir), "max_seq_lengths": lengths,
                                            "num_samples": 2})["test"]
    tokenizer = ruler_tasks.model_tokenizer({"pretrained": str(model_dir)})
    assert [d["max_length"] for d in documents] == [1024, 1024, 2048, 2048]
    for document in documents:
        used = ruler_tokens(tokenizer, document) + budget
        assert 0.8 * document["max_length"] <= used <= document["max_length"], (task, used)
        assert all(answer in document["input"] for answer in document["outputs"])
    text, answers = documents[-1]["input"], documents[-1]["outputs"]
    if task == "vt":  # the answers are exactly the variables that hold the queried value
        question = text[text.rindex("Memorize and track"):]
        value = re.search(r"assigned the value (\d+)", question).group(1)
        holding, assignments = set(), re.findall(r"VAR (\w+) = (VAR (\w+)|\d+)", question)
        for name, source, source_name in assignments * len(assignments):
            if source == value or source_name in holding:
                holding.add(name)
        assert holding == set(answers) and len(answers) == 5
    if task == "cwe":  # the 10 answers are the 10 most frequent words of the (last) list
        listed = re.findall(r"\d+\. (\S+)", text[text.rindex("Below is a numbered list"):].split("\nQuestion")[0])
        counts = Counter(listed).most_common()
        assert {word for word, _ in counts[:10]} == set(answers) and counts[9][1] > counts[10][1]
    if task == "fwe":  # the 3 answers are the 3 most frequent coded words apart from '....'
        counts = Counter(w for w in text.split("coded words. ")[1].split("\nQuestion")[0].split() if w != "....")
        assert [word for word, _ in counts.most_common(3)] == answers


def test_ruler_qa_reads_local_squad_and_hotpot_files(model_dir, tmp_path):
    squad = {"data": [{"paragraphs": [{"context": f"Paragraph {i} says the {w} is {i}.",
                                       "qas": [{"question": f"What is the {w}?", "answers": [{"text": str(i)}],
                                                "is_impossible": False}]} for i, w in enumerate(WORDS[:8])]}]}
    hotpot = [{"question": f"Where is the {w}?", "answer": f"place {i}",
               "context": [[f"Title {i}", [f"The {w} is at place {i}. "]], [f"Other {i}", ["Nothing here."]]]}
              for i, w in enumerate(WORDS[:8])]
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    (tmp_path / "hotpot.json").write_text(json.dumps(hotpot))
    tokenizer = ruler_tasks.model_tokenizer({"pretrained": str(model_dir)})
    for task, key in (("qa_squad", "squad_file"), ("qa_hotpot", "hotpot_file")):
        documents = ruler_tasks.generate(task, {"pretrained": str(model_dir), "max_seq_lengths": [512],
                                                "num_samples": 3, key: str(tmp_path / f"{task[3:]}.json")})["test"]
        for index, document in enumerate(documents):
            assert ruler_tokens(tokenizer, document) + 32 <= 512
            assert document["input"].count("Document ") >= 2 and document["outputs"][0] in document["input"]
    with pytest.raises(FileNotFoundError, match="dev-v2.0.json"):
        ruler_tasks.generate("qa_squad", {"pretrained": str(model_dir), "max_seq_lengths": [512]})
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a SQuAD v2 JSON"):
        ruler_tasks.generate("qa_squad", {"pretrained": str(model_dir), "squad_file": str(tmp_path / "bad.json")})


def test_ruler_scoring_matches_lm_eval():
    from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all

    cases = [("The numbers are 123 and 456.", ["123", "456"]), ("only 123\x01", ["123", "456"]),
             ("NOTHING", ["abc"]), ("  Answer: PARIS\n", ["paris"])]
    for prediction, references in cases:
        cleaned = ruler_tasks.clean_prediction(prediction)
        assert cleaned == postprocess_pred([prediction])[0]
        assert ruler_tasks.string_match_all(cleaned, references) == string_match_all([cleaned], [references])
    # QA: any reference counts (RULER's string_match_part); lm-eval 0.4.13 averages over references instead
    assert ruler_tasks.string_match_part("it is Paris", ["paris", "Paris, France"]) == 1.0
    assert ruler_tasks.string_match_part("it is Lyon", ["paris", "Paris, France"]) == 0.0
    document = {"max_length": 512, "depth": 30, "outputs": ["123", "456"]}
    assert ruler_tasks.process_results(document, ["123 and 999"]) == {"acc": 0.5, "512": 0.5, "512_depth30": 0.5}


def test_niah_grid_places_one_needle_at_each_depth(model_dir):
    documents = ruler_tasks.niah_grid(pretrained=str(model_dir), max_seq_lengths=[768, 1536], niah_depths=[0, 50, 100],
                                      num_samples=1)["test"]
    tokenizer = ruler_tasks.model_tokenizer({"pretrained": str(model_dir)})
    assert [(d["max_length"], d["depth"]) for d in documents] == [(768, 0), (768, 50), (768, 100), (1536, 0),
                                                                   (1536, 50), (1536, 100)]
    for document in documents:
        assert ruler_tokens(tokenizer, document) + 128 <= document["max_length"]
        haystack = document["input"].split("afterwards.\n")[1].split("\nWhat is")[0]
        position = haystack.index("One of the special magic") / len(haystack)
        assert abs(position - document["depth"] / 100) < 0.1


def test_niah_grid_table_and_heatmap(tmp_path):
    results = {"acc,none": 0.5, "512,none": 0.75, "512_depth0,none": 1.0, "512_depth50,none": 0.5,
               "512_depth0_stderr,none": "N/A", "1024_depth0,none": 0.0, "1024_depth50,none": 0.25}
    grid = grid_scores(results)
    assert grid == {512: {0: 1.0, 50: 0.5}, 1024: {0: 0.0, 50: 0.25}}
    table = niah_markdown(grid)
    assert "| 512 tokens | 1.000 | 0.500 |" in table and "| 1024 tokens | 0.000 | 0.250 |" in table
    from hf_valuearch.evaluation.summary import plot_niah

    plot_niah(grid, tmp_path / "heatmap.png")
    assert (tmp_path / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- scripts/evaluate.py


@pytest.mark.slow
def test_evaluate_script_runs_each_suite(model_dir, core_data, tmp_path, capsys):
    root = core_data[0]
    run_script("evaluate", "--model", str(model_dir), "--suite", "core", "--data-dir", str(root),
               "--tasks", "copa,winogrande,lambada_openai", "--limit", "4", "--batch-size", "4",
               "--output", str(tmp_path / "core"))
    record = json.loads((tmp_path / "core" / "results.json").read_text())
    assert record["suite"] == "core" and set(record["summary"]) == {"copa", "winogrande", "lambada_openai"}
    accuracies = {name: record["lm_eval"]["results"][f"core_{name}"]["acc,none"] for name in record["summary"]}
    assert record["core_score"] == pytest.approx(core_summary(accuracies)[1])
    assert "**CORE score**" in (tmp_path / "core" / "summary.md").read_text()

    run_script("evaluate", "--model", str(model_dir), "--suite", "ruler", "--tasks", "niah_single_1,vt",
               "--lengths", "1024", "1536", "--limit", "1", "--batch-size", "2", "--output", str(tmp_path / "ruler"))
    record = json.loads((tmp_path / "ruler" / "results.json").read_text())
    assert set(record["summary"]) == {"niah_single_1", "vt"}
    assert set(record["summary"]["vt"]) == {"1024", "1536", "acc"}
    assert (tmp_path / "ruler" / "ruler_accuracy_vs_length.png").is_file()
    assert "| vt |" in (tmp_path / "ruler" / "summary.md").read_text()

    run_script("evaluate", "--model", str(model_dir), "--suite", "niah", "--lengths", "768", "2304",
               "--depths", "0", "100", "--limit", "1", "--batch-size", "2", "--output", str(tmp_path / "niah"))
    record = json.loads((tmp_path / "niah" / "results.json").read_text())
    assert set(record["summary"]["niah_grid"]) == {"768_depth0", "768_depth100", "2304_depth0", "2304_depth100", "acc"}
    assert record["lm_eval"]["config"]["model_args"]["max_length"] == 2304  # beyond max_position_embeddings
    summary_md = (tmp_path / "niah" / "summary.md").read_text()
    assert "| 2304 tokens |" in summary_md and (tmp_path / "niah" / "niah_heatmap.png").is_file()
    capsys.readouterr()


def script_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_script("evaluate", *argv)
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "Traceback" not in message
    return message


def test_evaluate_script_errors(model_dir, tmp_path, capsys):
    data = tmp_path / "data"
    common = ["--output", str(tmp_path / "out")]
    assert "no such directory" in script_error(capsys, "--model", str(tmp_path / "nope"), "--suite", "core", *common)
    assert "unknown suite 'mmlu'" in script_error(capsys, "--model", str(model_dir), "--suite", "mmlu", *common)
    message = script_error(capsys, "--model", str(model_dir), "--suite", "core", "--data-dir", str(data), *common)
    assert "lacks 21 CORE file(s)" in message  # hellaswag and hellaswag_zeroshot share a file
    assert all(task.path in message for task in CORE_TASKS.values())
    message = script_error(capsys, "--model", str(model_dir), "--suite", "core", "--data-dir", str(data),
                           "--tasks", "copa,arc_easy", *common)
    assert "commonsense_reasoning/copa.jsonl" in message and "piqa" not in message
    write_jsonl(data / CORE_TASKS["copa"].path, [{"query": "q", "choices": ["a", "b"], "gold": 0}])
    (data / CORE_TASKS["copa"].path).write_text('{"query": "q", "choices": ["a", "b"], "gold": 0}\n{"query": "q"\n')
    message = script_error(capsys, "--model", str(model_dir), "--suite", "core", "--data-dir", str(data),
                           "--tasks", "copa", *common)
    assert "copa.jsonl:2: not valid JSON" in message
    (data / CORE_TASKS["copa"].path).write_text('{"query": "q", "choices": "ab"}\n')
    message = script_error(capsys, "--model", str(model_dir), "--suite", "core", "--data-dir", str(data),
                           "--tasks", "copa", *common)
    assert "copa.jsonl:1: a multiple_choice item needs 'query' (str), 'choices' (list), 'gold' (int)" in message
    assert "unknown core task(s) mmlu" in script_error(capsys, "--model", str(model_dir), "--suite", "core",
                                                       "--data-dir", str(data), "--tasks", "mmlu", *common)
    assert "dev-v2.0.json" in script_error(capsys, "--model", str(model_dir), "--suite", "ruler",
                                           "--tasks", "qa_squad", *common)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("{}")
    assert "pass --overwrite" in script_error(capsys, "--model", str(model_dir), "--suite", "niah", *common)


# ---------------------------------------------------------------- every architecture, lm-eval's command line


SEVERAL_CHUNKS = {"kvm": dict(kvm_chunk_size=4, kvm_state_min_slots=4)}  # padding spans several KVM chunks


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_left_padded_batches_match_single_requests(model_type, model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = tiny_model(model_type, vocab_size=len(tokenizer), **SEVERAL_CHUNKS.get(model_type, {}))
    contexts = ["The grass is green. The sky is blue. The sun is", "Most of what",
                "A special magic number is hidden within the following text. Make sure"]  # 3 lengths
    loglikelihood = [Instance("loglikelihood", {}, (c, " yellow again"), i) for i, c in enumerate(contexts)]
    generation = [Instance("generate_until", {}, (c, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}), i)
                  for i, c in enumerate(contexts)]
    results = {}
    for batch_size in (1, 3):
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device="cpu")
        results[batch_size] = (lm.loglikelihood(loglikelihood), lm.generate_until(generation))
    for (single, _), (batched, _) in zip(results[1][0], results[3][0]):
        assert batched == pytest.approx(single, abs=1e-4)
    assert results[3][1] == results[1][1]


RUN_WITHOUT_PACKAGE = (  # lm-eval's command line in a process where `import hf_valuearch` raises ImportError
    "import runpy, sys\n"
    "sys.modules['hf_valuearch'] = None\n"
    "sys.argv = ['lm_eval', *sys.argv[1:]]\n"
    "runpy.run_module('lm_eval', run_name='__main__')\n"
)


@pytest.mark.slow
def test_lm_eval_cli_with_include_path_on_remote_code_checkpoint(model_dir, core_data, tmp_path):
    data_root, model, tokenizer = core_data
    metadata = {"core_data_dir": str(data_root), "max_seq_lengths": [768], "num_samples": 2}
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    subprocess.run([sys.executable, "-c", RUN_WITHOUT_PACKAGE, "run", "--model", "hf", "--model_args",
                    f"pretrained={model_dir},trust_remote_code=True", "--include_path", str(TASK_DIR),
                    "--tasks", "core_copa,ruler_offline_niah_single_1", "--metadata", json.dumps(metadata),
                    "--batch_size", "2", "--device", "cpu", "--output_path", str(tmp_path / "out")],
                   check=True, cwd=tmp_path, env=env)
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    items = [json.loads(line) for line in (data_root / CORE_TASKS["copa"].path).read_text().splitlines()]
    correct = [min(range(2), key=direct_scores(model, tokenizer, "multiple_choice",
                                               reference_prompts("multiple_choice", item, [], " ")).__getitem__)
               == item["gold"] for item in items]
    assert results["core_copa"]["acc,none"] == pytest.approx(sum(correct) / len(correct))
    assert set(results["ruler_offline_niah_single_1"]) >= {"acc,none", "768,none"}
