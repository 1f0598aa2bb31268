import pandas as pd
import pytest

from raypipe.predict.relations import IterationText, format_relation, relation_frame

IT = IterationText(
    question="Who wrote X?",
    reasoning="r2 text",
    query="q2 text",
    first_reasoning="r0 text",
    prev_reasoning="r1 text",
    prev_query="q1 text",
    top_title="Doc T",
    top_text="doc body",
)


def test_adjacent_think_golden():
    assert format_relation("adjacent_think", IT) == (
        "Who wrote X? [SEP] [PREV] r1 text [PREV_SUBQ] q1 text [SEP] [CURR] r2 text [CURR_SUBQ] q2 text"
    )


def test_long_distance_golden():
    assert (
        format_relation("long_distance", IT)
        == "Who wrote X? [SEP] [ORIG] r0 text [SEP] [CURR_SUBQ] q2 text [CURR] r2 text"
    )


def test_intra_iteration_golden():
    assert format_relation("intra_iteration", IT) == (
        "Who wrote X? [SEP] r2 text [CURR_SUBQ] q2 text [CURR_TITLE] Doc T [CURR_INFO] doc body"
    )


def test_fields_are_truncated_and_missing_fields_empty():
    long = IterationText("q" * 300, "r" * 300, None, "o", None, None, "t" * 200, "x" * 300)
    text = format_relation("intra_iteration", long, field_chars=256, title_chars=128)
    assert text == f"{'q' * 256} [SEP] {'r' * 256} [CURR_SUBQ]  [CURR_TITLE] {'t' * 128} [CURR_INFO] {'x' * 256}"
    assert format_relation("adjacent_think", long).startswith(f"{'q' * 256} [SEP] [PREV]  [PREV_SUBQ]  [SEP]")


def test_unknown_relation():
    with pytest.raises(ValueError, match="unknown relation"):
        format_relation("sideways", IT)


def _tables():
    iterations = pd.DataFrame(
        [
            {
                "qid": "a",
                "dataset": "d",
                "iteration": 0,
                "query": None,
                "reasoning": "r0",
                "doc_ids": [],
                "probe_f1": 0.0,
                "utility": None,
            },
            {
                "qid": "a",
                "dataset": "d",
                "iteration": 2,
                "query": "q2",
                "reasoning": "r2",
                "doc_ids": ["x9"],
                "probe_f1": 1.0,
                "utility": 0.5,
            },
            {
                "qid": "a",
                "dataset": "d",
                "iteration": 1,
                "query": "q1",
                "reasoning": "r1",
                "doc_ids": ["x1", "x2"],
                "probe_f1": 0.5,
                "utility": 0.5,
            },
        ]
    )
    trajectories = pd.DataFrame([{"qid": "a", "question": "Q?"}])
    return iterations, trajectories


def test_relation_frame_uses_previous_first_and_top_document():
    iterations, trajectories = _tables()
    docs = {"x1": ("T1", "body1"), "x9": ("T9", "body9")}
    frame = relation_frame(iterations, trajectories, doc_lookup=docs.get)
    assert frame["iteration"].tolist() == [1, 2]  # iteration 0 is not predicted
    assert frame["utility"].tolist() == [0.5, 0.5]
    first, second = frame.iloc[0], frame.iloc[1]
    assert first["text_adjacent_think"] == "Q? [SEP] [PREV] r0 [PREV_SUBQ]  [SEP] [CURR] r1 [CURR_SUBQ] q1"
    assert second["text_adjacent_think"] == "Q? [SEP] [PREV] r1 [PREV_SUBQ] q1 [SEP] [CURR] r2 [CURR_SUBQ] q2"
    assert second["text_long_distance"] == "Q? [SEP] [ORIG] r0 [SEP] [CURR_SUBQ] q2 [CURR] r2"
    assert first["text_intra_iteration"] == "Q? [SEP] r1 [CURR_SUBQ] q1 [CURR_TITLE] T1 [CURR_INFO] body1"


def test_relation_frame_needs_documents_for_intra():
    iterations, trajectories = _tables()
    with pytest.raises(ValueError, match="doc_lookup"):
        relation_frame(iterations, trajectories)
    assert "text_intra_iteration" not in relation_frame(iterations, trajectories, relations=["long_distance"])


def test_document_lookups_from_the_corpus_and_the_doc_store(tmp_path):
    from raypipe.data.loaders import Passage
    from raypipe.retrieval.store import DocStore, corpus_documents

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i}", "contents": "\\"T{i}\\"\\ntext {i}"}}\n' for i in range(5)))
    assert corpus_documents(corpus) == {f"d{i}": (f"T{i}", f"text {i}") for i in range(5)}
    assert corpus_documents(corpus, {"d3", "d1"}) == {"d1": ("T1", "text 1"), "d3": ("T3", "text 3")}
    DocStore.write([Passage(f"d{i}", f"T{i}", f"text {i}") for i in range(5)], tmp_path / "docs.parquet")
    store = DocStore.read(tmp_path / "docs.parquet")
    assert [(p.doc_id, p.title) for p in store.by_id(["d4", "d0"])] == [("d4", "T4"), ("d0", "T0")]
    with pytest.raises(KeyError):
        store.by_id(["nope"])
