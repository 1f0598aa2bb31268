"""Question and corpus loaders (FlashRAG-style jsonl) and the bundled multi-hop QA sample.

Questions: one JSON object a line with ``id``, ``question``, ``golden_answers`` (a list of strings, or
one string) and any extra fields, which are kept. Corpus: ``id`` and ``contents`` = quoted title,
newline, text (split at the first newline only; the quotes around the title are removed).
Bad input raises :class:`DataError` naming the file and line; nothing is dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUNDLED_DIR = Path(__file__).resolve().parent / "mhqa"
BUNDLED_DATASETS = ("hotpotqa", "2wikimultihopqa", "musique")
BUNDLED_CORPUS = BUNDLED_DIR / "corpus.jsonl"


class DataError(ValueError):
    """Malformed input data; the message names the file and line."""


@dataclass(frozen=True)
class Question:
    qid: str
    dataset: str
    question: str
    golden_answers: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Passage:
    doc_id: str
    title: str
    text: str


def dataset_path(name_or_path: str) -> Path:
    """The file of a bundled dataset name, or the given path."""
    if name_or_path in BUNDLED_DATASETS:
        return BUNDLED_DIR / f"{name_or_path}.jsonl"
    path = Path(name_or_path)
    if not path.exists():
        raise DataError(
            f"{name_or_path}: neither a bundled dataset ({', '.join(BUNDLED_DATASETS)}) nor an existing file"
        )
    return path


def dataset_name(name_or_path: str) -> str:
    """The name recorded in the ``dataset`` column: the bundled name or the file's stem."""
    return name_or_path if name_or_path in BUNDLED_DATASETS else Path(name_or_path).stem


def load_questions(name_or_path: str, limit: int | None = None) -> list[Question]:
    """Load a question file (first ``limit`` questions), validating every line up to the limit."""
    path = dataset_path(name_or_path)
    name = dataset_name(name_or_path)
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for lineno, obj in _json_lines(path):
        if limit is not None and len(questions) >= limit:
            break
        where = f"{path}:{lineno}"
        qid = _required_str(obj, "id", where, allow_int=True)
        text = _required_str(obj, "question", where)
        if not text.strip():
            raise DataError(f"{where}: empty question (id {qid!r})")
        golds = _golden_answers(obj, where)
        if qid in seen:
            raise DataError(f"{where}: duplicate id {qid!r} (first on line {seen[qid]})")
        seen[qid] = lineno
        extra = {k: v for k, v in obj.items() if k not in ("id", "question", "golden_answers")}
        questions.append(Question(qid=qid, dataset=name, question=text, golden_answers=golds, extra=extra))
    return questions


def load_datasets(names: list[str], limit: int | None = None, limit_files: bool = True) -> list[Question]:
    """Load several question files, the first ``limit`` questions of each; ids must be unique across them
    (they key every table). ``limit_files=False`` cuts the bundled datasets only and runs question files
    given by path whole (``data.limit`` from a preset, unlike ``--limit N``)."""
    questions: list[Question] = []
    owner: dict[str, str] = {}
    for name in names:
        cut = limit if limit_files or name in BUNDLED_DATASETS else None
        for q in load_questions(name, cut):
            if q.qid in owner:
                raise DataError(f"id {q.qid!r} appears in both {owner[q.qid]} and {name}")
            owner[q.qid] = name
            questions.append(q)
    return questions


def iter_corpus(path: str | Path = BUNDLED_CORPUS, byte_range: tuple[int, int, int] | None = None) -> Iterator[Passage]:
    """Stream passages from a corpus jsonl, validating each line (duplicate ids: within what is read).

    ``byte_range=(start, end, first_lineno)`` reads only the lines that start in ``[start, end)``
    (``start`` at a line start; the index build reads a corpus in such blocks)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"corpus file not found: {path}")
    seen: set[str] = set()
    for lineno, obj in _json_lines(path, *(byte_range or ())):
        where = f"{path}:{lineno}"
        doc_id = _required_str(obj, "id", where, allow_int=True)
        contents = _required_str(obj, "contents", where)
        if doc_id in seen:
            raise DataError(f"{where}: duplicate passage id {doc_id!r}")
        seen.add(doc_id)
        title, text = split_contents(contents)
        yield Passage(doc_id=doc_id, title=title, text=text)


def load_corpus(path: str | Path = BUNDLED_CORPUS) -> list[Passage]:
    return list(iter_corpus(path))


def split_contents(contents: str) -> tuple[str, str]:
    """Split FlashRAG ``contents`` into (title, text) at the first newline; strip the title's quotes."""
    title, _, text = contents.partition("\n")
    if len(title) >= 2 and title.startswith('"') and title.endswith('"'):
        title = title[1:-1]
    return title, text


def _json_lines(
    path: Path, start: int = 0, end: int | None = None, first_lineno: int = 1
) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open("rb") as fh:
        fh.seek(start)
        pos = start
        for lineno, raw in enumerate(fh, start=first_lineno):
            if end is not None and pos >= end:
                break
            pos += len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def _required_str(obj: dict[str, Any], key: str, where: str, allow_int: bool = False) -> str:
    if key not in obj:
        raise DataError(f"{where}: missing field {key!r}")
    value = obj[key]
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise DataError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    return value


def _golden_answers(obj: dict[str, Any], where: str) -> list[str]:
    if "golden_answers" not in obj:
        raise DataError(f"{where}: missing field 'golden_answers'")
    golds = obj["golden_answers"]
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list) or not all(isinstance(g, str) for g in golds):
        raise DataError(f"{where}: 'golden_answers' must be a list of strings")
    if not golds:
        raise DataError(f"{where}: 'golden_answers' is empty")
    return golds
