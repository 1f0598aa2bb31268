import json

import pytest

from raypipe.data.loaders import (
    BUNDLED_DATASETS,
    DataError,
    load_corpus,
    load_datasets,
    load_questions,
    split_contents,
)


def q(qid="1", question="Who?", golds=("A",), **extra):
    return json.dumps({"id": qid, "question": question, "golden_answers": list(golds), **extra})


def test_bundled_datasets_load_with_their_sizes():
    sizes = {name: len(load_questions(name)) for name in BUNDLED_DATASETS}
    assert sizes == {"hotpotqa": 300, "2wikimultihopqa": 300, "musique": 362}
    first = load_questions("hotpotqa", limit=1)[0]
    assert first.qid == "5a8b57f25542995d1e6f1371"
    assert first.golden_answers == ["yes"]
    assert first.extra["supporting_titles"] == ["Scott Derrickson", "Ed Wood"]


def test_bundled_corpus():
    corpus = load_corpus()
    assert len(corpus) == 13844
    assert corpus[0].doc_id == "p0" and corpus[0].title == "Ed Wood (film)"
    assert corpus[0].text.startswith("Ed Wood is a 1994 American")
    ids = {p.doc_id for p in corpus}
    for question in load_datasets(list(BUNDLED_DATASETS)):
        assert set(question.extra["paragraph_ids"]) <= ids


def test_split_contents_first_newline_only_and_inner_quotes():
    assert split_contents('"Don "Red" Barry"\nline one\nline two') == ('Don "Red" Barry', "line one\nline two")
    assert split_contents("no title line") == ("no title line", "")


def test_limit_and_extra_fields(write_jsonl):
    path = write_jsonl([q("a", type="bridge"), q("b"), q("c")])
    questions = load_questions(str(path), limit=2)
    assert [x.qid for x in questions] == ["a", "b"]
    assert questions[0].extra == {"type": "bridge"}
    assert questions[0].dataset == "data"


def test_single_string_golden_answer_and_int_id(write_jsonl):
    path = write_jsonl([json.dumps({"id": 7, "question": "Q?", "golden_answers": "A"})])
    (question,) = load_questions(str(path))
    assert question.qid == "7" and question.golden_answers == ["A"]


@pytest.mark.parametrize(
    "lines,message",
    [
        ([q(), "{not json"], r"data.jsonl:2: malformed JSON"),
        ([json.dumps({"id": "1", "golden_answers": ["a"]})], r"data.jsonl:1: missing field 'question'"),
        ([json.dumps({"question": "x", "golden_answers": ["a"]})], r"data.jsonl:1: missing field 'id'"),
        ([json.dumps({"id": "1", "question": "x"})], r"data.jsonl:1: missing field 'golden_answers'"),
        ([q(question="   ")], r"data.jsonl:1: empty question"),
        ([q(golds=())], r"data.jsonl:1: 'golden_answers' is empty"),
        ([json.dumps({"id": "1", "question": "x", "golden_answers": [1]})], r"must be a list of strings"),
        ([q("a"), q("b"), q("a")], r"data.jsonl:3: duplicate id 'a' \(first on line 1\)"),
        ([b'{"id": "1", "question": "caf\xe9", "golden_answers": ["a"]}'], r"data.jsonl:1: not valid UTF-8"),
        (["[1, 2]"], r"data.jsonl:1: expected a JSON object"),
    ],
)
def test_question_errors_name_file_and_line(write_jsonl, lines, message):
    path = write_jsonl(lines)
    with pytest.raises(DataError, match=message):
        load_questions(str(path))


def test_blank_lines_are_skipped_but_counted(write_jsonl):
    path = write_jsonl([q("a"), "", "{bad"])
    with pytest.raises(DataError, match=r":3: malformed JSON"):
        load_questions(str(path))


def test_unknown_dataset():
    with pytest.raises(DataError, match="neither a bundled dataset"):
        load_questions("nosuchset")


def test_duplicate_ids_across_datasets(write_jsonl, tmp_path):
    a = write_jsonl([q("x")], name="a.jsonl")
    b = write_jsonl([q("x")], name="b.jsonl")
    with pytest.raises(DataError, match="id 'x' appears in both"):
        load_datasets([str(a), str(b)])


@pytest.mark.parametrize(
    "lines,message",
    [
        ([json.dumps({"id": "p0"})], r"corpus.jsonl:1: missing field 'contents'"),
        ([json.dumps({"id": "p0", "contents": '"T"\nx'})] * 2, r"corpus.jsonl:2: duplicate passage id 'p0'"),
        (['{"id": "p0", "contents": '], r"corpus.jsonl:1: malformed JSON"),
    ],
)
def test_corpus_errors(write_jsonl, lines, message):
    path = write_jsonl(lines, name="corpus.jsonl")
    with pytest.raises(DataError, match=message):
        load_corpus(path)


def test_a_presets_limit_cuts_bundled_datasets_only_and_an_explicit_limit_every_file(write_jsonl):
    import argparse

    from raypipe.core.config import load_config
    from raypipe.stages.probe import flag_overrides

    mine = str(write_jsonl([q(str(i)) for i in range(7)], name="mine.jsonl"))

    def run(limit: int | None = None) -> dict[str, int]:
        args = argparse.Namespace(
            dataset=[f"hotpotqa,{mine}"], limit=limit, no_probe=False, no_retry=False
        )  # --dataset, --limit
        data = load_config("embedded", flag_overrides(args)).data
        questions = load_datasets(data.datasets, data.limit, data.limit_files)
        return {name: sum(x.dataset == name for x in questions) for name in ("hotpotqa", "mine")}

    assert run() == {"hotpotqa": 4, "mine": 7}  # the embedded preset's data.limit: 4, the user's whole file
    assert run(2) == {"hotpotqa": 2, "mine": 2}  # --limit 2 cuts every dataset
    assert len(load_datasets([mine], limit=3)) == 3  # a direct caller's limit cuts files (the default)
