"""RULER (Hsieh et al. 2024, arXiv:2404.06654) and a NIAH length x depth grid, generated offline for lm-eval.

lm-eval's own `ruler` tasks download Paul Graham essays, SQuAD and HotpotQA and need NLTK data; these generators
need nothing from the network. The haystack is a local text file (metadata `haystack_file`) or the embedded
ESSAY; QA tasks read local SQuAD v2 / HotpotQA files (`squad_file`, `hotpot_file`). Every prompt is sized with the
model's own tokenizer (metadata `tokenizer`, else `pretrained`): prompt tokens + the task's generation budget
<= each length of `max_seq_lengths`. Task formats (needle sentence, templates, answer prefixes, generation budgets)
and scoring (string_match_all; string_match_part for QA) are RULER's as packaged in lm-eval 0.4.13.
lm-eval loads this file from the task folder (`!function ruler_tasks.NAME`), so it imports nothing from hf_valuearch.
"""

from __future__ import annotations

import json
import math
import random
import re
import string
import uuid
from functools import cache
from pathlib import Path

import datasets
from tqdm import tqdm
from transformers import AutoTokenizer

ESSAY = (
    "Most of what a gardener learns comes from watching the same patch of ground across many seasons. In spring the "
    "soil is cold and slow, and seeds that went in too early simply wait. By early summer the beds fill quickly, and "
    "the work changes from planting to thinning, because crowded rows give small and bitter vegetables. A dry July "
    "teaches more than any book: the plants that were watered deeply and rarely send their roots down and survive, "
    "while the ones that were sprinkled every evening wilt at noon. Autumn brings its own lessons. The last tomatoes "
    "ripen on the windowsill, the beans are left to dry for next year, and the leaves that fall are raked into a pile "
    "that will be dark and crumbly by the following spring. Nothing in a garden happens on command. A good gardener "
    "keeps a notebook, writes down when the first frost came, which seeds failed and which variety of squash the "
    "beetles ignored, and reads it again every winter. Over the years the notes become a map of one small place. "
    "Neighbours trade seeds across the fence and argue about the best time to sow peas. Some swear by the old "
    "calendar and plant on certain days; others watch the oak leaves and sow when they are the size of a mouse's ear. "
    "Both groups harvest peas. The soil itself improves slowly. Each load of compost adds a little life, worms arrive "
    "where there were none, and after a decade a spade slides into ground that once had to be broken with a pick. "
    "Visitors see the flowers and the full baskets, but the gardener sees the years of small decisions underneath, "
    "most of them forgotten, a few of them written down, and all of them still there in the ground."
)
REPEAT = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
NIAH_TEMPLATE = ("Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {kind} afterwards.\n{context}\nWhat are all the special magic {kind} for "
                 "{query} mentioned in the provided text?")
ADJECTIVES = ("able acid angry brave bright broad calm cheap clean clever cold cool curly damp dark deep dry dull "
              "eager early easy empty fair fancy fast fierce flat fresh full gentle giant glad grand great green "
              "happy hard heavy high hollow huge humble icy jolly keen kind large late lazy light little lively "
              "long loud low lucky mild modern narrow neat new nice noisy odd old pale plain polite proud quick "
              "quiet rapid rare raw rich rough round royal rusty sad safe salty sharp shiny short shy silent silly "
              "slim slow small smooth soft solid sour spicy steep sticky stiff still stout strong sunny super sweet "
              "swift tall tame tender thick thin tidy tiny tough vast warm weak wet wide wild wise witty young").split()
NOUNS = ("acorn anchor apple arrow badge bagel banjo barn basket beach bell bench berry bicycle blanket boat bottle "
         "bridge brush bucket butter button cabin cactus camera candle canoe canyon carpet castle cattle cello chair "
         "cherry chimney cloud clover coast comet copper cotton crayon crystal daisy desert dragon drum eagle engine "
         "feather fence fiddle forest fossil fountain garden garlic glacier globe goat guitar hammer harbor helmet "
         "hill honey island jacket jungle kettle kite ladder lagoon lantern lemon library lizard magnet maple marble "
         "meadow mirror mountain needle ocean orchard otter paddle parrot pebble pepper piano pillow planet pocket "
         "puzzle quilt rabbit radio raft river rocket saddle sailor salmon shadow shelf shovel signal spoon squirrel "
         "stable statue stone storm tablet teapot thunder tiger towel tractor trumpet tulip tunnel umbrella valley "
         "violin wagon walnut window wizard yacht zebra").split()
WORDS = sorted({f"{adjective}-{noun}" for adjective in ADJECTIVES for noun in NOUNS})
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's 40 evenly spaced needle depths (percent)
GEN_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}  # RULER's max_gen_toks per task family
NIAH_TASKS = {  # haystack, key kind, value kind, keys, values per key, queried keys (RULER's niah_* configs)
    "niah_single_1": ("repeat", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
}


@cache
def _tokenizer(name: str):
    return AutoTokenizer.from_pretrained(name, trust_remote_code=True)


def model_tokenizer(metadata: dict):
    """The tokenizer that sizes prompts: metadata `tokenizer`, else `pretrained` (lm-eval passes the model_args)."""
    name = metadata.get("tokenizer") or metadata.get("pretrained")
    if not isinstance(name, str) or not name:
        raise ValueError("RULER/NIAH tasks size prompts with the model's tokenizer: pass model_args pretrained=DIR "
                         "or metadata tokenizer=DIR")
    return _tokenizer(name)


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


def haystack_words(haystack_file: str | None = None) -> list[str]:
    """The essay haystack as whitespace-separated words: `haystack_file`'s text, else the embedded ESSAY."""
    text = Path(haystack_file).read_text(encoding="utf-8", errors="replace") if haystack_file else ESSAY
    words = text.split()
    if not words:
        raise ValueError(f"haystack file {haystack_file} holds no text")
    return words


def essay_sentences(words: list[str], count: int) -> list[str]:
    """The first `count` haystack words (cycling through the text as often as needed), split into sentences."""
    text = " ".join(words[i % len(words)] for i in range(count))
    return re.split(r"(?<=[.!?])\s+", text)


def random_value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(1_000_000, 9_999_999))
    if kind == "words":
        return rng.choice(WORDS)
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def insert_at_depths(units: list[str], needles: list[str], depths: list[float]) -> list[str]:
    """`units` with needle i inserted before unit round(depth_i / 100 * len(units))."""
    positions = [round(depth / 100 * len(units)) for depth in depths]
    out = list(units)
    for position, needle in sorted(zip(positions, needles), key=lambda pair: -pair[0]):
        out.insert(position, needle)
    return out


def niah_sample(size: int, rng: random.Random, haystack: str, key_kind: str, value_kind: str, keys: int, values: int,
                queries: int, words: list[str], depths: list[float] | None = None) -> dict:
    """One needle-in-a-haystack prompt with `size` haystack units (words, repeats or distractor needles)."""
    key_list = []
    while len(key_list) < keys:
        key = random_value(key_kind, rng)
        if key not in key_list:
            key_list.append(key)
    value_lists = [[random_value(value_kind, rng) for _ in range(values)] for _ in key_list]
    needles = [NEEDLE.format(kind=value_kind, key=key, value=value)
               for key, value_list in zip(key_list, value_lists) for value in value_list]
    rng.shuffle(needles)
    depths = depths if depths is not None else [rng.choice(DEPTHS) for _ in needles]
    if haystack == "essay":
        context = " ".join(insert_at_depths(essay_sentences(words, size), needles, depths))
    else:
        units = [REPEAT] * size if haystack == "repeat" else [
            NEEDLE.format(kind=value_kind, key=random_value(key_kind, rng), value=random_value(value_kind, rng))
            for _ in range(size)]
        context = "\n".join(insert_at_depths(units, needles, depths))
    asked = rng.sample(range(keys), queries)
    query = ", ".join(key_list[i] for i in asked[:-1]) + (", and " if queries > 1 else "") + key_list[asked[-1]]
    kind = value_kind
    if queries * values == 1:  # RULER words a single answer in the singular
        kind = value_kind[:-1]
        prompt = (NIAH_TEMPLATE.replace("Some", "A").replace("are all", "is").replace("are", "is")
                  .format(kind=kind, context=context, query=query))
        prefix = f"The special magic {kind} for {query} mentioned in the provided text is"
    else:
        prompt = NIAH_TEMPLATE.format(kind=kind, context=context, query=query)
        prefix = f"The special magic {kind} for {query} mentioned in the provided text are"
    return {"input": prompt, "outputs": [value for i in asked for value in value_lists[i]], "gen_prefix": prefix}


def variable_tracking_sample(size: int, rng: random.Random, hops: int = 4, example: dict | None = None) -> dict:
    """RULER vt: one chain VAR A = 12345, VAR B = VAR A, ... (`hops` hops) hidden among `size` noise lines; the
    answer is every variable holding the value. `example` (a solved sample) is prepended as a one-shot example."""
    names = set()
    while len(names) < hops + 1:
        names.add("".join(rng.choices(string.ascii_uppercase, k=5 if example else 3)))
    names = list(names)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[i + 1]} = VAR {names[i]} " for i in range(hops)]
    lines = [REPEAT + "\n"] * size
    for offset, position in enumerate(sorted(rng.choices(range(size + 1), k=len(chain)))):
        lines.insert(position + offset, chain[offset])
    context = " ".join(lines).replace(". \n", ".\n")
    question = (f"Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
                f"Question: Find all variables that are assigned the value {value} in the text above.")
    prefix = (f"Answer: According to the chain(s) of variable assignment in the text above, {hops + 1} variables are "
              f"assgined the value {value}, they are:")
    shot = f"{example['input']} {example['gen_prefix']} {' '.join(example['outputs'])}\n\n" if example else ""
    return {"input": shot + question, "outputs": names, "gen_prefix": prefix}


def common_words_sample(size: int, rng: random.Random, max_length: int) -> dict:
    """RULER cwe: a numbered list of `size` distinct words, 10 of them frequent; answer: those 10 words."""
    def word_list(count: int, common: int, rare: int) -> tuple[str, list[str]]:
        chosen = rng.sample(WORDS, count)
        listed = chosen[:10] * common + chosen[10:] * rare
        rng.shuffle(listed)
        return " ".join(f"{i + 1}. {word}" for i, word in enumerate(listed)), chosen[:10]

    template = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
                "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
                "list?")
    prefix = "Answer: The top 10 words that appear most often in the list are:"
    short = max_length < 4096  # RULER's repeat counts for short and long contexts
    example_context, example_answer = word_list(20 if short else 40, 3 if short else 10, 1 if short else 3)
    context, answer = word_list(size, 6 if short else 30, 1 if short else 3)
    example = (template.format(context=example_context) + " " + prefix + " "
               + " ".join(f"{i + 1}. {word}" for i, word in enumerate(example_answer)))
    return {"input": example + "\n" + template.format(context=context), "outputs": answer, "gen_prefix": prefix}


def frequent_words_sample(size: int, rng: random.Random, max_length: int) -> dict:
    """RULER fwe: about `size` coded words with Zipf(2) counts (rank k: size * k^-2 / zeta(2)) over a vocabulary of
    max_length // 50 random 6-letter words (rank 1 is '....' noise); answer: the words of ranks 2-4."""
    vocabulary = set()
    while len(vocabulary) < max(max_length // 50, 4):
        vocabulary.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    vocabulary = sorted(vocabulary)
    rng.shuffle(vocabulary)
    vocabulary[0] = "...."
    zeta_2 = math.pi ** 2 / 6
    text = [word for rank, word in enumerate(vocabulary, start=1) for _ in range(int(size / rank**2 / zeta_2))]
    rng.shuffle(text)
    prompt = ("Read the following coded text and track the frequency of each coded word. Find the three most "
              f"frequently appeared coded words. {' '.join(text)}\nQuestion: Do not provide any explanation. Please "
              "ignore the dots '....'. What are the three most frequently appeared words in the above coded text?")
    return {"input": prompt, "outputs": vocabulary[1:4],
            "gen_prefix": "Answer: According to the coded text above, the three most frequently appeared words are:"}


def read_qa(kind: str, path: str) -> tuple[list[dict], list[str]]:
    """(questions [{query, outputs, context}], all paragraphs) from a SQuAD v2 dev or HotpotQA distractor file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if kind == "squad":
            paragraphs = [p for article in data["data"] for p in article["paragraphs"]]
            documents = sorted({p["context"] for p in paragraphs})
            questions = [{"query": qa["question"], "outputs": [a["text"] for a in qa["answers"]],
                          "context": [p["context"]]}
                         for p in paragraphs for qa in p["qas"] if not qa.get("is_impossible") and qa["answers"]]
        else:
            documents = sorted({f"{title}\n{''.join(sentences)}"
                                for item in data for title, sentences in item["context"]})
            questions = [{"query": item["question"], "outputs": [item["answer"]],
                          "context": [f"{title}\n{''.join(sentences)}" for title, sentences in item["context"]]}
                         for item in data]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        expected = ("SQuAD v2 JSON (dev-v2.0.json)" if kind == "squad"
                    else "HotpotQA JSON (hotpot_dev_distractor_v1.json)")
        raise ValueError(f"{path}: not a {expected} file ({type(error).__name__}: {error})") from None
    return questions, documents


def qa_sample(size: int, rng: random.Random, question: dict, documents: list[str]) -> dict:
    """RULER qa: the question's own paragraphs among distractors, `size` documents in all."""
    distractors = [d for d in rng.sample(documents, min(len(documents), size + len(question["context"])))
                   if d not in question["context"]]
    chosen = question["context"] + distractors[: max(0, size - len(question["context"]))]
    rng.shuffle(chosen)
    context = "\n\n".join(f"Document {i + 1}:\n{document}" for i, document in enumerate(chosen))
    instruction = ("Answer the question based on the given documents. Only give me the answer and do not output any "
                   "other words.")
    prompt = (f"{instruction}\n\nThe following are given documents.\n\n{context}\n\n{instruction}\n\n"
              f"Question: {question['query']}")
    return {"input": prompt, "outputs": question["outputs"], "gen_prefix": "Answer:"}


def fits(sample: dict, tokenizer, max_length: int, gen_tokens: int) -> bool:
    """Whether the prompt, its answer prefix and the generation budget fit in `max_length` tokens."""
    return count_tokens(tokenizer, sample["input"] + " " + sample["gen_prefix"]) + gen_tokens <= max_length


def too_short(max_length: int, gen_tokens: int) -> ValueError:
    return ValueError(f"length {max_length} leaves no room for the smallest prompt of this task plus {gen_tokens} "
                      "generated tokens; use longer --lengths")


def largest_size(build, tokenizer, max_length: int, gen_tokens: int, upper: int) -> int:
    """The largest size in [1, upper] whose sample `build(size)` fits (doubling, then bisection)."""
    if not fits(build(1), tokenizer, max_length, gen_tokens):
        raise too_short(max_length, gen_tokens)
    low = 1
    while low < upper and fits(build(min(2 * low, upper)), tokenizer, max_length, gen_tokens):
        low = min(2 * low, upper)
    high = min(2 * low, upper + 1)  # build(low) fits, build(high) does not (or high is past upper)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(build(middle), tokenizer, max_length, gen_tokens) else (low, middle)
    return low


def fitted_samples(build, count: int, tokenizer, max_length: int, gen_tokens: int, upper: int, desc: str) -> list[dict]:
    """`count` samples `build(index, size)`: the size is searched on sample 0, then shrunk by 5% steps for any
    sample that does not fit (as RULER sizes a haystack once per length)."""
    size = largest_size(lambda size: build(0, size), tokenizer, max_length, gen_tokens, upper)
    samples = []
    for index in tqdm(range(count), desc=desc):
        used = size
        sample = build(index, used)
        while not fits(sample, tokenizer, max_length, gen_tokens):
            if used == 1:
                raise too_short(max_length, gen_tokens)
            used = max(1, int(used * 0.95))
            sample = build(index, used)
        samples.append(sample)
    return samples


def generate(task: str, metadata: dict) -> dict[str, datasets.Dataset]:
    """Documents of `task` for every length in metadata `max_seq_lengths` (default [4096]), `num_samples`
    each (default 500, as RULER), reproducible from metadata `seed` (default 42)."""
    tokenizer = model_tokenizer(metadata)
    count, seed = int(metadata.get("num_samples") or 500), int(metadata.get("seed", 42))
    words = haystack_words(metadata.get("haystack_file"))
    family = "niah" if task in NIAH_TASKS else task.split("_")[0]
    upper = {"cwe": len(WORDS)}
    if family == "qa":
        kind = task[3:]
        path = metadata.get(f"{kind}_file")
        if not path or not Path(path).is_file():
            name = "dev-v2.0.json (SQuAD v2 dev)" if kind == "squad" else "hotpot_dev_distractor_v1.json (HotpotQA)"
            raise FileNotFoundError(f"RULER task qa_{kind} reads a local {name}: pass metadata {kind}_file=PATH "
                                    f"(got {path!r})")
        questions, documents = read_qa(kind, path)
        upper["qa"] = len(documents)
    example = variable_tracking_sample(5, random.Random(f"{seed}-vt-example"))  # vt's one-shot example
    out = []
    for length in metadata.get("max_seq_lengths") or [4096]:
        def build(index, size, length=length):
            rng = random.Random(f"{seed}-{task}-{length}-{index}")
            if family == "niah":
                return niah_sample(size, rng, *NIAH_TASKS[task], words=words)
            if family == "vt":
                return variable_tracking_sample(size, rng, example=example)
            if family == "cwe":
                return common_words_sample(size, rng, length)
            if family == "fwe":
                return frequent_words_sample(size, rng, length)
            return qa_sample(size, rng, questions[index % len(questions)], documents)

        samples = fitted_samples(build, count, tokenizer, length, GEN_TOKENS[family], upper.get(family, 2 * length),
                                 desc=f"{task} @ {length} tokens")
        out += [{**sample, "max_length": length, "index": index} for index, sample in enumerate(samples)]
    return {"test": datasets.Dataset.from_list(out)}


def niah_grid(**metadata) -> dict[str, datasets.Dataset]:
    """NIAH grid: one needle (a 7-digit number for a word key) at each depth of metadata `niah_depths` (percent,
    default 0, 10, ..., 100) in an essay haystack of each length of `max_seq_lengths`, `num_samples` per cell
    (default 10)."""
    tokenizer = model_tokenizer(metadata)
    count, seed = int(metadata.get("num_samples") or 10), int(metadata.get("seed", 42))
    words = haystack_words(metadata.get("haystack_file"))
    out = []
    for length in metadata.get("max_seq_lengths") or [4096]:
        for depth in metadata.get("niah_depths") or list(range(0, 101, 10)):
            def build(index, size, length=length, depth=depth):
                rng = random.Random(f"{seed}-grid-{length}-{depth}-{index}")
                return niah_sample(size, rng, "essay", "words", "numbers", 1, 1, 1, words, depths=[depth])

            samples = fitted_samples(build, count, tokenizer, length, GEN_TOKENS["niah"], 2 * length,
                                     desc=f"niah_grid @ {length} tokens, depth {depth}%")
            out += [{**sample, "max_length": length, "depth": depth, "index": index}
                    for index, sample in enumerate(samples)]
    return {"test": datasets.Dataset.from_list(out)}


def _task(name: str):
    def load(**metadata):
        return generate(name, metadata)

    load.__name__ = name
    load.__doc__ = f"lm-eval `custom_dataset` of RULER task {name} (see `generate`)."
    return load


niah_single_1, niah_single_2, niah_single_3 = _task("niah_single_1"), _task("niah_single_2"), _task("niah_single_3")
niah_multikey_1, niah_multikey_2 = _task("niah_multikey_1"), _task("niah_multikey_2")
niah_multikey_3, niah_multivalue = _task("niah_multikey_3"), _task("niah_multivalue")
niah_multiquery, vt, cwe, fwe = _task("niah_multiquery"), _task("vt"), _task("cwe"), _task("fwe")
qa_squad, qa_hotpot = _task("qa_squad"), _task("qa_hotpot")


def clean_prediction(text: str) -> str:
    """RULER's post-processing: control characters become newlines, then strip."""
    return re.sub(r"[\x00-\x1f]", "\n", text.strip()).strip()


def string_match_all(prediction: str, references: list[str]) -> float:
    """Fraction of references found (case-insensitively) in the prediction."""
    return sum(reference.lower() in prediction.lower() for reference in references) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """1 if any reference is found (case-insensitively) in the prediction (RULER's QA score)."""
    return float(any(reference.lower() in prediction.lower() for reference in references))


def _scores(doc: dict, score: float) -> dict[str, float]:
    """The score under "acc" (all lengths), under the document's length, and under "LENGTH_depthD" for the grid."""
    scores = {"acc": score, str(doc["max_length"]): score}
    if doc.get("depth") is not None:
        scores[f"{doc['max_length']}_depth{doc['depth']}"] = score
    return scores


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return _scores(doc, string_match_all(clean_prediction(results[0]), doc["outputs"]))


def process_results_part(doc: dict, results: list[str]) -> dict[str, float]:
    return _scores(doc, string_match_part(clean_prediction(results[0]), doc["outputs"]))
