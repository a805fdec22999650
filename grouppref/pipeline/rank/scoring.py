"""Pure scoring helpers of the ``rank`` stage: rule checks, answer extraction, scores -> tiers,
the ensemble, and the judge's log-odds. No model is loaded here, so all of it is testable alone.

Notation: K candidates of one group, N scored sequences, V vocabulary, R rankers, H hidden size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")
_FINAL_MARKERS = (
    re.compile(r"^\s*#{4}\s*(.+?)\s*$", re.MULTILINE),  # GSM8K style "#### 42"
    re.compile(r"final answer\s*(?:is|:)\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE),
    re.compile(r"\banswer\s*(?:is|:)\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE),
)
_STRIP = " \t\n.,;:!?\"'`*()[]{}"


# -- rule checks ------------------------------------------------------------------------------
def length_score(n: int, target: int) -> float:
    """Closeness of a length ``n`` to ``target``: ``-|n - target| / target`` (0 is best).

    Example:
        >>> length_score(60, 80), length_score(80, 80), length_score(120, 80)
        (-0.25, 0.0, -0.5)
    """
    return -abs(n - target) / target


def text_length(text: str, unit: str) -> int:
    """Length of ``text`` in characters (``"chars"``) or whitespace-separated words (``"words"``)."""
    return len(text.split()) if unit == "words" else len(text)


def regex_score(text: str, pattern: re.Pattern[str]) -> float:
    """1.0 when ``pattern`` matches anywhere in ``text`` (``re.search``), else 0.0."""
    return 1.0 if pattern.search(text) else 0.0


def keywords_score(text: str, keywords: Sequence[str], case_sensitive: bool = False) -> float:
    """Share of ``keywords`` present in ``text`` as whole words (not inside a longer word).

    Example:
        >>> keywords_score("Red and blue.", ["red", "green"])
        0.5
    """
    flags = 0 if case_sensitive else re.IGNORECASE
    found = sum(bool(re.search(rf"(?<!\w){re.escape(k)}(?!\w)", text, flags)) for k in keywords)
    return found / len(keywords)


# -- verifiable answers -----------------------------------------------------------------------
def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def parse_number(text: str) -> float | None:
    """The number ``text`` states, or None: ``"1,234.5"``, ``"$12"``, ``"50%"``, ``"3/4"``,
    ``"\\frac{3}{4}"``, ``"-2e3"``. The whole string (less currency, ``%`` and outer punctuation)
    must be the number.

    Example:
        >>> parse_number("$1,234.50"), parse_number("3/4"), parse_number("42 apples")
        (1234.5, 0.75, None)
    """
    s, previous = text, None
    while s != previous:  # "**42**." -> "42"
        previous, s = s, s.strip("\"'`*()[] \t\n").rstrip(".,;:!?")
    s = s.replace("$", "").replace("€", "").replace("£", "").rstrip("%").strip()
    if m := re.fullmatch(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", s):
        s = f"{m.group(1)}/{m.group(2)}"
    if not _NUMBER.fullmatch(s):
        return None
    num, _, den = s.replace(",", "").replace(" ", "").partition("/")
    try:
        value = float(num) / float(den) if den else float(num)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def last_number(text: str) -> float | None:
    """The last number written anywhere in ``text`` (see :func:`parse_number`), or None."""
    for m in reversed(list(_NUMBER.finditer(text))):
        if (value := parse_number(m.group(0))) is not None:
            return value
    return None


def extract_final_answer(text: str, numeric: bool) -> str | None:
    """The final answer stated in ``text``.

    Tried in order: the last ``\\boxed{...}``; a ``#### X`` line; ``final answer: X`` /
    ``final answer is X``; ``answer: X`` / ``answer is X`` (the last such line wins). Without
    a marker: the last number in the text when ``numeric``, else the last non-empty line.
    """
    if (boxed := _last_boxed(text)) is not None:
        return boxed
    for marker in _FINAL_MARKERS:
        found = marker.findall(text)
        if found:
            return found[-1]
    if numeric:
        value = last_number(text)
        return None if value is None else repr(value)
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def normalise_answer(text: str) -> str:
    """Case-folded, whitespace collapsed, outer punctuation / quotes / markdown stripped."""
    return re.sub(r"\s+", " ", text).strip(_STRIP).strip().casefold()


def answers_match(answer: str, reference: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether an extracted ``answer`` equals ``reference``.

    A numeric reference is compared numerically (``math.isclose`` with ``rel_tol``/``abs_tol``)
    with the number the answer states, or failing that the last number in it; any other
    reference is compared as text under :func:`normalise_answer`.
    """
    ref_value = parse_number(reference)
    if ref_value is None:
        return normalise_answer(answer) == normalise_answer(reference)
    value = parse_number(answer)
    value = last_number(answer) if value is None else value
    return value is not None and math.isclose(value, ref_value, rel_tol=rel_tol, abs_tol=abs_tol)


def verify_score(text: str, reference: str, rel_tol: float = 1e-6) -> float:
    """1.0 when the final answer of ``text`` matches ``reference``, else 0.0."""
    answer = extract_final_answer(text, numeric=parse_number(reference) is not None)
    return 1.0 if answer is not None and answers_match(answer, reference, rel_tol) else 0.0


# -- scores -> ranking ------------------------------------------------------------------------
def scores_to_tiers(ids: Sequence[str], s: Sequence[float], tol: float) -> list[list[str]]:
    """Tiers (best first) from per-candidate scores ``s`` (higher is better); ties share a tier.

    A tier is opened by its best remaining score ``s_top`` and holds every candidate with
    ``s >= s_top - tol``, so within a tier no two scores differ by more than ``tol``. Inside a
    tier candidates keep their order in ``ids``.

    Example:
        >>> scores_to_tiers(["a", "b", "c", "d"], [1.0, 3.0, 1.0 + 1e-9, 2.0], tol=1e-6)
        [['b'], ['d'], ['a', 'c']]
    """
    if len(ids) != len(s):
        raise ValueError(f"{len(ids)} ids but {len(s)} scores")
    order = sorted(range(len(ids)), key=lambda i: -s[i])  # stable: ties keep input order
    tiers: list[list[int]] = []
    top = math.inf
    for i in order:
        if tiers and s[i] >= top - tol:
            tiers[-1].append(i)
        else:
            tiers.append([i])
            top = s[i]
    return [[ids[i] for i in sorted(tier)] for tier in tiers]


def standardise(s: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Z-scores within a group: ``z = (s - mean(s)) / std(s)`` (population std), 0 when
    ``std(s) <= eps`` (every candidate scored the same).

    Args:
        s (torch.Tensor): scores, shape (..., K).

    Returns:
        torch.Tensor: z-scores, shape (..., K).
    """
    centred = s - s.mean(dim=-1, keepdim=True)
    std = s.std(dim=-1, unbiased=False, keepdim=True)
    return torch.where(std > eps, centred / std.clamp_min(eps), torch.zeros_like(centred))


def ensemble_scores(s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Weighted ensemble of R rankers' scores of one group: ``e_k = Σ_r w_r z_rk / Σ_r w_r``
    with ``z_r = standardise(s_r)``, so every ranker counts on the same scale.

    Args:
        s (torch.Tensor): scores, shape (R, K).
        w (torch.Tensor): non-negative weights with a positive sum, shape (R,).

    Returns:
        torch.Tensor: ensemble scores, shape (K,).
    """
    z = standardise(s.to(torch.float64))  # (R, K)
    w = w.to(torch.float64)
    return (w[:, None] * z).sum(dim=0) / w.sum()


# -- LLM judge ---------------------------------------------------------------------------------
def verdict_log_odds(logits: torch.Tensor, yes_id: int, no_id: int) -> torch.Tensor:
    """Log-odds of the verdict tokens at the next position:
    ``log P(yes) - log P(no) = logits[:, yes] - logits[:, no]`` (the softmax normaliser cancels).

    Args:
        logits (torch.Tensor): next-token logits, shape (N, V).
        yes_id (int): token id of the positive verdict ("Yes", or "A" in pairwise mode).
        no_id (int): token id of the negative verdict ("No", or "B").

    Returns:
        torch.Tensor: shape (N,), float32.
    """
    logits = logits.float()
    return logits[:, yes_id] - logits[:, no_id]


def pairwise_scores(d: torch.Tensor) -> torch.Tensor:
    """Per-candidate scores from pairwise A/B log-odds asked in both orders.

    ``d[i, j] = log P(A) - log P(B)`` when candidate i is shown as A and j as B. The position
    bias b (a constant added to every ``d``) cancels in ``d[i, j] - d[j, i]``:
    ``s_i = Σ_{j≠i} (d[i, j] - d[j, i]) / (2 (K - 1))``, the mean debiased log-odds of i beating
    the others. The diagonal is ignored.

    Args:
        d (torch.Tensor): shape (K, K).

    Returns:
        torch.Tensor: shape (K,).
    """
    k = d.shape[0]
    off = d.masked_fill(torch.eye(k, dtype=torch.bool, device=d.device), 0.0)
    return (off.sum(dim=1) - off.sum(dim=0)) / (2 * (k - 1))


def cosine_scores(ref: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each candidate embedding to the reference embedding:
    ``s_k = <r, c_k> / (|r| |c_k|)``.

    Args:
        ref (torch.Tensor): shape (H,).
        cand (torch.Tensor): shape (K, H).

    Returns:
        torch.Tensor: shape (K,).
    """
    return torch.nn.functional.cosine_similarity(cand, ref[None, :], dim=-1)
