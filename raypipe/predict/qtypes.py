"""The question types the head's one-hot reads (``train.include_type``), from a run's question files.

The seed's head input carries a ``type`` column (``predictions/prediction_head/train.py``
``include_type=True``: "the dataset question-type indicator"): the datasets' own question type,
HotpotQA's ``bridge`` / ``comparison``, 2WikiMultihopQA's ``compositional`` / ``comparison`` /
``inference`` / ``bridge_comparison``, MuSiQue's hop count (``2hop`` ...). raypipe's question files keep
every extra field (:mod:`raypipe.data.loaders`): the type is ``type``, or FlashRAG's ``metadata.type``.
"""

from __future__ import annotations

from pathlib import Path

from raypipe.core.config import DataConfig, load_config
from raypipe.data.loaders import Question, load_datasets


def question_type(question: Question) -> str | None:
    value = question.extra.get("type")
    if value is None and isinstance(question.extra.get("metadata"), dict):
        value = question.extra["metadata"].get("type")
    return None if value is None else str(value)


def question_types(data: DataConfig) -> dict[str, str]:
    """qid -> type for the questions of ``data`` that have one."""
    questions = load_datasets(data.datasets, data.limit, data.limit_files)
    return {q.qid: t for q in questions if (t := question_type(q)) is not None}


def run_question_types(run_path: str | Path) -> dict[str, str]:
    """The types of a run's questions, from the question files its ``config.yaml`` names ({} without one)."""
    path = Path(run_path) / "config.yaml"
    if not path.exists():
        return {}
    return question_types(load_config(path).data)
