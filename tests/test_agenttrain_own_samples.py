"""A second round's data (issue 43's rejection-sampling lever): a run's own successful trajectories on training
questions, replayed through the agent loop, give the same segments a planned trajectory gets; a transcript the loop
does not reproduce, an unanswered or low-F1 trajectory and a run on dev questions are refused."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from raypipe.agenttrain.own_samples import (
    REJECT_LOW_F1,
    REJECT_NOT_ANSWERED,
    REJECT_REPLAY,
    own_trajectories,
)
from raypipe.agenttrain.trajectories import PROMPT, run_build
from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import load_corpus
from raypipe.data.split import bundled_split
from raypipe.stages.agent_data import training_run_rows
from tests.helpers.agent_data import retriever_and_tokenizer


@pytest.fixture(scope="module")
def planned():
    """Planned trajectories of a few training questions, and what a run that wrote them would have recorded."""
    config = load_config("embedded")
    retriever, tokenizer = retriever_and_tokenizer(config)
    train = bundled_split(config.agent_train.dev_percent).train
    questions = train[:8] + train[-4:]
    kept, _ = run_build(questions, config, retriever, {p.doc_id: p for p in load_corpus()}, tokenizer)
    assert len(kept) >= 3
    runs = [as_run_row(row) for row in kept]
    return config, retriever, tokenizer, {q.qid: q for q in questions}, kept, runs


def as_run_row(row: dict) -> dict:
    """The trajectories-table row of a run whose agent wrote ``row``'s turns (its transcript: all after the prompt)."""
    assert row["segments"][0]["kind"] == PROMPT
    transcript = "".join(s["text"] for s in row["segments"][1:])
    return {
        "qid": row["qid"],
        "final_answer": row["answer"],
        "final_f1": 1.0,
        "stop_reason": "answer",
        "transcript": transcript,
        "n_iterations": row["searches"] + 1,
    }


def replayed(planned, runs, min_f1=1.0):
    config, retriever, tokenizer, questions, _, _ = planned
    return asyncio.run(own_trajectories(questions, runs, config, retriever, tokenizer, min_f1))


def test_a_replayed_run_gives_the_segments_and_documents_of_the_planned_trajectory(planned):
    kept, rejected = replayed(planned, planned[5])
    assert not rejected and len(kept) == len(planned[4])
    for own, plan in zip(kept, planned[4]):
        assert own["segments"] == plan["segments"]
        assert own["queries"] == plan["queries"] and own["doc_ids"] == plan["doc_ids"]
        assert own["searches"] == plan["searches"] and own["answer"] == plan["answer"]


def test_unanswered_low_f1_and_unreproducible_trajectories_are_rejected(planned):
    runs = [dict(r) for r in planned[5][:3]]
    runs[0]["stop_reason"] = "turn_limit"
    runs[1]["final_f1"] = 0.4
    runs[2]["transcript"] = runs[2]["transcript"].replace("Doc 1(Title:", "Doc 1(Title: x", 1)  # not the retriever's
    kept, rejected = replayed(planned, runs, min_f1=0.5)
    assert not kept
    assert [r["reason"] for r in rejected] == [REJECT_NOT_ANSWERED, REJECT_LOW_F1, REJECT_REPLAY]


def test_a_run_on_questions_outside_the_training_pool_is_refused(planned, tmp_path):
    split = bundled_split(planned[0].agent_train.dev_percent)
    rows = [{**planned[5][0], "qid": split.dev[0].qid}]
    RunDir(tmp_path).write_part("trajectories", pa.Table.from_pylist(rows), "part-0")
    with pytest.raises(SystemExit, match="outside the training pool"):
        training_run_rows(str(tmp_path), split.qids("train"))
    assert training_run_rows(str(tmp_path), [split.dev[0].qid]) == rows


def test_limit_and_from_run_together_are_refused(capsys):
    from raypipe.stages.agent_data import main

    with pytest.raises(SystemExit):
        main(["out", "--from-run", "run", "--limit", "3"])
    assert "--from-run takes the run's own questions" in capsys.readouterr().err
