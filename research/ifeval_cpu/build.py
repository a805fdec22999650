"""Build the instruction-following prompts of the IFEval-style experiment.

Prompts are topic x task x constraints, with 1 or 2 verifiable constraints each, all meetable
in a short answer (<= 48 tokens). Each prompt's constraints go into its metadata as IFEval ids
and kwargs (``metadata["constraints"]``, JSON), which the rule ranker's ``constraints`` check and
the evaluation read (:mod:`grouppref.pipeline.rank.constraints`).

Held out (``test.jsonl``): prompts on topics that never occur in training, half of them with a
constraint pair that never occurs in training either (:data:`HELD_OUT_PAIRS`).

    .venv/bin/python -m research.ifeval_cpu.build --out runs/ifeval/prompts
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouppref.api import make_constraint

TOPICS = (
    "volcanoes", "bicycles", "coffee", "the moon", "honeybees", "libraries", "rain", "chess",
    "bread", "trains", "whales", "gardening", "the ocean", "clocks", "mountains", "pizza",
    "rivers", "owls", "music", "deserts", "umbrellas", "bridges", "tea", "snow", "forests",
    "cats", "dogs", "the sun", "robots", "books", "football", "apples", "castles", "lighthouses",
    "penguins", "candles", "maps", "islands", "cheese", "kites", "painting", "rainbows",
    "thunderstorms", "elephants", "bakeries", "swimming", "the wind", "stars", "dolphins",
    "coral reefs", "autumn", "winter", "spring", "summer", "birthdays", "friendship", "running",
    "pianos", "guitars", "museums", "airplanes", "sailing boats", "farms", "tomatoes",
    "butterflies", "mushrooms", "glaciers", "caves", "photography", "cooking", "soap",
    "recycling", "hiking", "camping", "pyramids", "the internet", "email", "ants",
    "horses", "rabbits", "frogs", "sunflowers", "oak trees", "chocolate", "ice cream", "rice",
    "soup", "markets", "schools", "teachers", "doctors", "firefighters", "astronauts",
    "dinosaurs", "fossils", "magnets", "batteries", "telescopes", "microscopes", "bicycle helmets",
    "sleep", "breakfast", "water", "salt", "honey", "wool", "cotton", "paper", "pencils",
    "windmills", "solar panels", "earthquakes", "tides", "clouds", "fog", "lightning", "parrots",
    "sharks", "turtles", "octopuses", "bats", "wolves", "foxes", "bears", "eagles", "zebras",
    "giraffes", "lemons", "carrots", "potatoes", "strawberries", "bananas", "coconuts", "tents",
    "boots", "hats", "scarves", "mirrors", "keys", "doors", "stairs", "elevators", "trams",
    "buses", "subways", "highways", "parks", "playgrounds", "zoos", "circuses", "theaters",
    "movies", "poetry", "dancing", "yoga", "gymnastics", "tennis", "basketball", "skiing",
    "surfing", "fishing", "knitting", "pottery", "origami", "puzzles", "board games", "jokes",
)
TASKS = (
    "Describe {topic} in one short sentence.",
    "Give one short tip about {topic}.",
    "Tell me one interesting fact about {topic}.",
    "Write a short slogan about {topic}.",
    "In a few words, why do people like {topic}?",
    "Write one short sentence a child could say about {topic}.",
)
WORDS = ("bright", "simple", "history", "energy", "people", "nature", "small", "color")
END_PHRASES = ("That is all.", "Thank you.", "Have a nice day.", "The end.")
START_WORDS = ("Yes", "Well", "Today", "Imagine", "Surprisingly")


@dataclass(frozen=True)
class Kind:
    """A constraint type of the experiment: its short name, IFEval id, kwargs and phrasing."""

    name: str
    id: str

    def draw(self, rng: random.Random) -> tuple[dict[str, Any], str]:
        """Random kwargs and the instruction sentence that asks for them."""
        return _DRAW[self.name](rng)


def _lowercase(rng: random.Random) -> tuple[dict[str, Any], str]:
    return {}, "Your entire answer must be in lowercase letters, with no capital letters at all."


def _capital(rng: random.Random) -> tuple[dict[str, Any], str]:
    return {}, "Your entire answer must be in English capital letters only."


def _no_comma(rng: random.Random) -> tuple[dict[str, Any], str]:
    return {}, "Do not use any commas in your answer."


def _json(rng: random.Random) -> tuple[dict[str, Any], str]:
    return ({"required_keys": ["answer"]},
            'Answer only with JSON that has the key "answer", like {"answer": "..."}.')


def _quotation(rng: random.Random) -> tuple[dict[str, Any], str]:
    return {}, "Wrap your entire answer in double quotation marks."


def _end(rng: random.Random) -> tuple[dict[str, Any], str]:
    phrase = rng.choice(END_PHRASES)
    return {"end_phrase": phrase}, f'End your answer with the exact phrase "{phrase}"'


def _include(rng: random.Random) -> tuple[dict[str, Any], str]:
    word = rng.choice(WORDS)
    return {"keywords": [word]}, f'Include the word "{word}" in your answer.'


def _max_words(rng: random.Random) -> tuple[dict[str, Any], str]:
    n = rng.choice((6, 8, 10, 12))
    return {"num_words": n + 1, "relation": "less than"}, f"Use at most {n} words."


def _one_sentence(rng: random.Random) -> tuple[dict[str, Any], str]:
    return {"num_sentences": 1, "relation": "exactly"}, "Answer in exactly one sentence."


def _start(rng: random.Random) -> tuple[dict[str, Any], str]:
    word = rng.choice(START_WORDS)
    return {"first_word": word.lower()}, f'Start your answer with the word "{word}".'


_DRAW = {"lowercase": _lowercase, "capital": _capital, "no_comma": _no_comma, "json": _json,
         "quotation": _quotation, "end_phrase": _end, "include_word": _include,
         "max_words": _max_words, "one_sentence": _one_sentence, "start_word": _start}
KINDS = {k.name: k for k in (
    Kind("lowercase", "change_case:english_lowercase"),
    Kind("capital", "change_case:english_capital"),
    Kind("no_comma", "punctuation:no_comma"),
    Kind("json", "detectable_format:json_format"),
    Kind("quotation", "startend:quotation"),
    Kind("end_phrase", "startend:end_checker"),
    Kind("include_word", "keywords:existence"),
    Kind("max_words", "length_constraints:number_words"),
    Kind("one_sentence", "length_constraints:number_sentences"),
    Kind("start_word", "startend:first_word"),  # IFEval's nth_paragraph_first_word also counts paragraphs
)}
# Pairs that cannot both hold (or contradict each other's wording).
INCOMPATIBLE = {frozenset(p) for p in (
    ("lowercase", "capital"), ("json", "quotation"), ("json", "end_phrase"),
    ("json", "start_word"), ("json", "capital"), ("lowercase", "start_word"),
    ("capital", "start_word"), ("json", "one_sentence"),
)}
# Pairs only the held-out split asks for.
HELD_OUT_PAIRS = {frozenset(p) for p in (
    ("lowercase", "end_phrase"), ("no_comma", "quotation"), ("capital", "include_word"),
    ("json", "max_words"), ("start_word", "one_sentence"), ("quotation", "max_words"),
)}


def all_pairs() -> list[frozenset[str]]:
    """Every compatible pair of constraint kinds."""
    return [frozenset(p) for p in itertools.combinations(KINDS, 2)
            if frozenset(p) not in INCOMPATIBLE]


def make_prompt(pid: str, topic: str, task: str, kinds: Sequence[str], rng: random.Random
                ) -> dict[str, Any]:
    """One prompt row: text, and the constraints as IFEval ids/kwargs (checked) in metadata."""
    sentences, specs = [], []
    for name in kinds:
        kwargs, sentence = KINDS[name].draw(rng)
        make_constraint(KINDS[name].id, kwargs)  # fails here, not in the ranker, if malformed
        specs.append({"id": KINDS[name].id, "kwargs": kwargs})
        sentences.append(sentence)
    text = " ".join([task.format(topic=topic), *sentences])
    meta = {"constraints": json.dumps(specs), "kinds": "+".join(kinds), "topic": topic}
    return {"prompt_id": pid, "prompt": text, "metadata": meta}


def build(n_train: int, n_test: int, seed: int, held_out_topics: int, n_val: int = 0,
          val_topics: int = 0) -> tuple[list[dict[str, Any]], ...]:
    """Train and held-out prompt rows (see the module docstring); with ``n_val`` also a
    validation split for choosing settings (learning rates), apart from both.

    Topics are shuffled once: the first ``held_out_topics`` are the test's, the next
    ``val_topics`` the validation split's, the rest training's; the validation split is drawn
    like the test (half of its prompts ask for a pair in :data:`HELD_OUT_PAIRS`) after both,
    so ``n_val = 0`` gives the same train and test rows as before it existed.

    Returns:
        ``(train, test)``, or ``(train, test, val)`` when ``n_val > 0``.
    """
    rng = random.Random(seed)
    topics = list(TOPICS)
    rng.shuffle(topics)
    test_topics = topics[:held_out_topics]
    val_pool = topics[held_out_topics:held_out_topics + val_topics]
    train_topics = topics[held_out_topics + val_topics:]
    if n_val and not val_pool:
        raise ValueError("a validation split needs its own topics: set val_topics > 0")
    seen_pairs = [p for p in all_pairs() if p not in HELD_OUT_PAIRS]
    singles = [frozenset([k]) for k in KINDS]
    held = sorted(HELD_OUT_PAIRS, key=sorted)

    def rows(n: int, split: str, topic_pool: list[str], pairs_fn) -> list[dict[str, Any]]:
        out, seen = [], set()
        while len(out) < n:
            topic, task = rng.choice(topic_pool), rng.choice(TASKS)
            kinds = sorted(pairs_fn(len(out)))
            key = (topic, task, tuple(kinds))
            if key in seen:
                continue
            seen.add(key)
            out.append(make_prompt(f"{split}-{len(out):04d}", topic, task, kinds, rng))
        return out

    def held_out_like(i: int) -> frozenset[str]:
        if i % 2 == 0:
            return rng.choice(held)
        return rng.choice(singles) if i % 6 == 1 else rng.choice(seen_pairs)

    train = rows(n_train, "train", train_topics,
                 lambda i: rng.choice(singles) if i % 3 == 0 else rng.choice(seen_pairs))
    test = rows(n_test, "test", test_topics, held_out_like)
    if not n_val:
        return train, test
    return train, test, rows(n_val, "val", val_pool, held_out_like)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="Folder for train.jsonl, test.jsonl.")
    ap.add_argument("--train", type=int, default=1000, help="Training prompts.")
    ap.add_argument("--test", type=int, default=300, help="Held-out prompts.")
    ap.add_argument("--held-out-topics", type=int, default=40, help="Topics only in test.")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    train, test = build(args.train, args.test, args.seed, args.held_out_topics)
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "test.jsonl", test)
    print(f"{len(train)} train and {len(test)} held-out prompts in {args.out}")


if __name__ == "__main__":
    main()
