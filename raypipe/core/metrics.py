"""Answer metrics: normalisation, exact match and token F1 under three published rules.

- ``squad``: SQuAD v1.1 — lowercase, drop punctuation, drop articles a/an/the, collapse whitespace.
- ``hotpotqa`` (default, as pyterrier-rag and the seed paper): SQuAD normalisation, and F1 = 0 when
  either side normalises to yes/no/noanswer and the two differ.
- ``r1searcher``: R1-Searcher's ``metric_calc_rule.py`` — underscores become spaces, punctuation (plus
  ‘ ’ ´ `) becomes a space instead of vanishing, the exact strings ``True``/``False`` map to yes/no, then
  the HotpotQA yes/no rule.

Every score is the maximum over the golden answers.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Literal

Rule = Literal["squad", "hotpotqa", "r1searcher"]
DEFAULT_RULE: Rule = "hotpotqa"
RULES: tuple[Rule, ...] = ("squad", "hotpotqa", "r1searcher")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
_R1_PUNCTUATION = frozenset(string.punctuation + "‘’´`")
_YES_NO = ("yes", "no", "noanswer")


def normalize_answer(text: str, rule: Rule = DEFAULT_RULE) -> str:
    """Normalise an answer string the way ``rule`` does before comparing tokens."""
    _check_rule(rule)
    if rule == "r1searcher":
        text = _r1_bool(text).replace("_", " ").lower()
        text = "".join(" " if ch in _R1_PUNCTUATION else ch for ch in text)
    else:
        text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, golden_answers: Sequence[str], rule: Rule = DEFAULT_RULE) -> float:
    """1.0 when the normalised prediction equals any normalised golden answer."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction, rule)
    return float(any(pred == normalize_answer(gold, rule) for gold in _golds(golden_answers)))


def f1_score(prediction: str | None, golden_answers: Sequence[str], rule: Rule = DEFAULT_RULE) -> float:
    """Token-level F1, maximum over golden answers; a missing prediction scores 0."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction, rule)
    return max(_token_f1(pred, normalize_answer(gold, rule), rule) for gold in _golds(golden_answers))


def _token_f1(pred: str, gold: str, rule: Rule) -> float:
    if rule != "squad" and (pred in _YES_NO or gold in _YES_NO) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _r1_bool(text: str) -> str:
    return {"True": "yes", "False": "no"}.get(text, text)


def _golds(golden_answers: Sequence[str]) -> Sequence[str]:
    if isinstance(golden_answers, str):
        return [golden_answers]
    if len(golden_answers) == 0:
        raise ValueError("golden_answers is empty: a question needs at least one answer")
    return golden_answers


def _check_rule(rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"unknown metric rule {rule!r}; choose one of {', '.join(RULES)}")
