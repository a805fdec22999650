"""Rows in the published schemas of the import layouts (UltraFeedback, Nectar), for the import tests."""

from __future__ import annotations

from typing import Any

# -- openbmb/UltraFeedback -----------------------------------------------------------------------


def uf_completion(model: str, response: str, ratings: dict[str, str], overall: float,
                  fine: float) -> dict[str, Any]:
    """One completion as on the dataset card: every aspect a {Rating, Rationale} object (the
    truthfulness and helpfulness ones with Type and "Rationale For Rating" too)."""
    annotations: dict[str, Any] = {}
    for aspect, rating in ratings.items():
        note: dict[str, Any] = {"Rating": rating, "Rationale": f"{aspect} rationale"}
        if aspect in ("helpfulness", "truthfulness"):
            note.update({"Type": ["1", "2"], "Rationale For Rating": "why"})
        annotations[aspect] = note
    return {"model": model, "principle": "helpfulness",
            "custom_system_prompt": "You are a helpful assistant.", "response": response,
            "annotations": annotations, "critique": "A critique.", "overall_score": overall,
            "fine-grained_score": fine}


def uf_row(instruction: str, completions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"source": "evol_instruct", "instruction": instruction,
            "models": [c["model"] for c in completions], "correct_answers": ["None"],
            "incorrect_answers": ["None"], "completions": completions}


def aspects(h: str, o: str, i: str, t: str) -> dict[str, str]:
    return {"helpfulness": h, "honesty": o, "instruction_following": i, "truthfulness": t}


UF_ROWS = [
    uf_row("Name a prime number.", [
        uf_completion("gpt-4", "7 is prime.", aspects("5", "5", "5", "5"), 9.0, 5.0),
        uf_completion("alpaca-7b", "9", aspects("1", "N/A", "3", "1"), 2.0, 1.7),
        uf_completion("wizardlm-7b", "2", aspects("3", "4", "3", "5"), 6.0, 3.75)]),
    uf_row("Say hello in French.", [
        uf_completion("gpt-4", "Bonjour.", aspects("5", "5", "5", "5"), 8.5, 5.0),
        uf_completion("bard", "Salut !", aspects("5", "4", "5", "5"), 8.5, 4.75)]),
    uf_row("What is 2+2?", [
        uf_completion("gpt-4", "4", aspects("N/A", "N/A", "N/A", "N/A"), 7.0, 0.0),
        uf_completion("falcon-40b-instruct", "5", aspects("1", "1", "2", "N/A"), 1.0, 1.3)]),
]


# -- berkeley-nest/Nectar ------------------------------------------------------------------------


NECTAR_ROWS = [
    {"prompt": "\n\nHuman: Name a prime number.\n\nAssistant:", "answers": [
        {"answer": "7", "model": "gpt-4", "rank": 1.0},
        {"answer": "9", "model": "llama-2-7b-chat", "rank": 3.0},
        {"answer": "2", "model": "gpt-3.5-turbo", "rank": 2.0}],
     "turns": 1, "num_responses": 3, "source": ["sharegpt"], "good_natured": True},
    {"prompt": "\n\nHuman: Hi!\n\nAssistant: Hello! How can I help?\n\nHuman: Tell me a joke."
               "\n\nAssistant:", "answers": [
        {"answer": "Why did the chicken cross the road?", "model": "gpt-4", "rank": 1.0},
        {"answer": "No.", "model": "mistral-7b-instruct", "rank": None},
        {"answer": "A pun.", "model": "gpt-3.5-turbo-instruct", "rank": 2.0},
        {"answer": "A pun. ", "model": "llama-2-7b-chat", "rank": 2.0}],
     "turns": 2, "num_responses": 4, "source": ["lmsys-chat-1m"], "good_natured": True},
    {"prompt": "\n\nHuman: Say yes.\n\nAssistant:", "answers": [
        {"answer": "Yes.", "model": "gpt-4", "rank": 1.0},
        {"answer": "Yes!", "model": "gpt-3.5-turbo", "rank": 1.0}],
     "turns": 1, "num_responses": 2, "source": ["flan"], "good_natured": True},
]
