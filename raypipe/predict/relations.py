"""The three trajectory relations that the supervised cross-encoders read (seed paper, Section 3).

Each relation turns one retrieval iteration i >= 1 into one text:

- adjacent-think: ``{q} [SEP] [PREV] {r_prev} [PREV_SUBQ] {q_prev} [SEP] [CURR] {r_i} [CURR_SUBQ] {q_i}``
- long-distance: ``{q} [SEP] [ORIG] {r_0} [SEP] [CURR_SUBQ] {q_i} [CURR] {r_i}``
- intra-iteration: ``{q} [SEP] {r_i} [CURR_SUBQ] {q_i} [CURR_TITLE] {title} [CURR_INFO] {text}``

q is the question, q_i the query of iteration i (ITERATIONS.query), r_i its reasoning: by default the
parsed think text of ITERATIONS.reasoning, without the search action, the query markup or a final
answer, as the seed feeds its cross-encoders (:func:`raypipe.features.similarity.reasoning_text`;
``train.reasoning_text="raw"`` keeps the whole turn). r_0 is the reasoning before any retrieval,
r_prev / q_prev those of iteration i-1, and title / text the current query's top retrieved document.
Every field is cut to ``field_chars`` characters (the title to ``title_chars``); a missing field
(q_prev at iteration 1) is an empty string. The bracketed markers are added to the tokenizer as
special tokens, as the seed code does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from raypipe.features.similarity import reasoning_text

RELATIONS = ("adjacent_think", "long_distance", "intra_iteration")
SHORT = {"adjacent_think": "at", "long_distance": "ld", "intra_iteration": "ii"}
SPECIAL_TOKENS = {
    "adjacent_think": ("[PREV]", "[CURR]", "[PREV_SUBQ]", "[CURR_SUBQ]"),
    "long_distance": ("[ORIG]", "[CURR]", "[CURR_SUBQ]"),
    "intra_iteration": ("[CURR_SUBQ]", "[CURR_TITLE]", "[CURR_INFO]"),
}
TARGETS = {"p": "probe_f1", "u": "utility"}  # short name -> ITERATIONS column

# (title, text) of a document id; None when the id is unknown.
DocLookup = Callable[[str], "tuple[str, str] | None"]


@dataclass(frozen=True)
class IterationText:
    """The texts one iteration's relations need (already known online, nothing gold-based)."""

    question: str
    reasoning: str  # r_i
    query: str  # q_i
    first_reasoning: str  # r_0
    prev_reasoning: str  # r_{i-1}
    prev_query: str  # q_{i-1}
    top_title: str
    top_text: str


def _cut(value: Any, chars: int) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return str(value)[:chars]


def format_relation(relation: str, it: IterationText, field_chars: int = 256, title_chars: int = 128) -> str:
    """The cross-encoder input text of one relation for one iteration."""
    q = _cut(it.question, field_chars)
    r, sq = _cut(it.reasoning, field_chars), _cut(it.query, field_chars)
    if relation == "adjacent_think":
        pr, pq = _cut(it.prev_reasoning, field_chars), _cut(it.prev_query, field_chars)
        return f"{q} [SEP] [PREV] {pr} [PREV_SUBQ] {pq} [SEP] [CURR] {r} [CURR_SUBQ] {sq}"
    if relation == "long_distance":
        return f"{q} [SEP] [ORIG] {_cut(it.first_reasoning, field_chars)} [SEP] [CURR_SUBQ] {sq} [CURR] {r}"
    if relation == "intra_iteration":
        title, text = _cut(it.top_title, title_chars), _cut(it.top_text, field_chars)
        return f"{q} [SEP] {r} [CURR_SUBQ] {sq} [CURR_TITLE] {title} [CURR_INFO] {text}"
    raise ValueError(f"unknown relation {relation!r}; known: {', '.join(RELATIONS)}")


def trajectory_texts(
    question: str,
    rows: Sequence[Mapping[str, Any]],
    top_doc: Callable[[Mapping[str, Any]], tuple[str, str]],
    reasoning: Literal["parsed", "raw"] = "parsed",
) -> list[tuple[int, IterationText]]:
    """(iteration, IterationText) for every row with iteration >= 1 of one trajectory (rows in any order).

    ``top_doc(row)`` gives (title, text) of the row's top document; ``reasoning`` how r_i is read from a
    row (see the module docstring).
    """

    def r(row: Mapping[str, Any]) -> str | None:
        return reasoning_text(row.get("reasoning"), reasoning)

    by_it = {int(r["iteration"]): r for r in rows}
    if len(by_it) != len(rows):
        raise ValueError(f"duplicate iterations in trajectory {rows[0].get('qid')!r}")
    first = by_it.get(0, {})
    out = []
    for i in sorted(k for k in by_it if k >= 1):
        row, prev = by_it[i], by_it.get(i - 1, {})
        title, text = top_doc(row)
        out.append(
            (
                i,
                IterationText(
                    question=question,
                    reasoning=r(row),
                    query=row.get("query"),
                    first_reasoning=r(first),
                    prev_reasoning=r(prev),
                    prev_query=prev.get("query"),
                    top_title=title,
                    top_text=text,
                ),
            )
        )
    return out


def lookup_top_doc(doc_lookup: DocLookup | None) -> Callable[[Mapping[str, Any]], tuple[str, str]]:
    """top_doc for offline rows: the visible texts when the row carries them, else ``doc_lookup(doc_ids[0])``."""

    def top_doc(row: Mapping[str, Any]) -> tuple[str, str]:
        titles, texts = row.get("doc_titles"), row.get("doc_texts")
        if titles is not None and texts is not None and len(titles) and len(texts):
            return str(titles[0]), str(texts[0])
        ids = row.get("doc_ids")
        if ids is None or len(ids) == 0:
            return "", ""  # empty retrieval: the relation sees empty document fields
        if doc_lookup is None:
            raise ValueError("the intra-iteration relation needs document texts: pass a doc_lookup")
        found = doc_lookup(str(ids[0]))
        return found if found is not None else ("", "")

    return top_doc


def relation_frame(
    iterations: pd.DataFrame,
    trajectories: pd.DataFrame,
    relations: Iterable[str] = RELATIONS,
    doc_lookup: DocLookup | None = None,
    field_chars: int = 256,
    title_chars: int = 128,
    reasoning: Literal["parsed", "raw"] = "parsed",
) -> pd.DataFrame:
    """One row per qid x iteration >= 1: keys, targets and a ``text_<relation>`` column per relation."""
    relations = list(relations)
    needs_docs = "intra_iteration" in relations
    questions = dict(zip(trajectories["qid"], trajectories["question"]))
    top_doc = lookup_top_doc(doc_lookup) if needs_docs else (lambda row: ("", ""))
    records = []
    for qid, group in iterations.groupby("qid", sort=True):
        if qid not in questions:
            raise ValueError(f"qid {qid!r} is in iterations but not in trajectories")
        rows = group.to_dict("records")
        by_it = {int(r["iteration"]): r for r in rows}
        for i, it in trajectory_texts(questions[qid], rows, top_doc, reasoning):
            row = by_it[i]
            rec = {
                "qid": qid,
                "dataset": row["dataset"],
                "iteration": i,
                "probe_f1": row.get("probe_f1"),
                "utility": row.get("utility"),
            }
            for rel in relations:
                rec[f"text_{rel}"] = format_relation(rel, it, field_chars, title_chars)
            records.append(rec)
    columns = ["qid", "dataset", "iteration", "probe_f1", "utility", *(f"text_{r}" for r in relations)]
    return pd.DataFrame.from_records(records, columns=columns)
