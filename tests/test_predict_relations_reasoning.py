"""r_i in the cross-encoders' relation texts is the parsed reasoning, the raw turn an option."""

import pandas as pd

from raypipe.predict.relations import relation_frame

SEARCH_R1_TURNS = [
    "<think> I need the author. </think>\n<search> Hamlet author </search>",
    "<think> It is Shakespeare. </think>\n<search> Shakespeare birthplace </search>",
]
R1_SEARCHER_TURNS = [
    " I need the author. <|begin_of_query|> Hamlet\tauthor <|end_of_query|>",
    " It is Shakespeare. <|begin_of_query|> Shakespeare\tbirthplace <|end_of_query|>",
]


def _frame(turns, reasoning="parsed"):
    iterations = pd.DataFrame(
        [
            {
                "qid": "a",
                "dataset": "d",
                "iteration": i,
                "query": None if i == 0 else f"q{i}",
                "reasoning": turn,
                "doc_ids": None if i == 0 else ["x"],
                "probe_f1": 0.0,
                "utility": None if i == 0 else 0.0,
            }
            for i, turn in enumerate(turns)
        ]
    )
    trajectories = pd.DataFrame([{"qid": "a", "question": "Who wrote Hamlet?"}])
    return relation_frame(iterations, trajectories, ["adjacent_think", "long_distance"], reasoning=reasoning)


def test_relation_texts_read_the_parsed_reasoning_of_both_protocols():
    """The seed's r_i is parsed reasoning: DanielTian97/agentic_rag_predictions
    ``predictions/supervised/data.py`` ``build_relation_frame`` (lines 107-141) reads "parsed trajectory
    states" ``r``/``q``, parsed as ``predictions/unsupervised/semantic_similarity.py`` lines 95-154 do: the
    think text without the search action, its query markup or an answer."""
    for turns in (SEARCH_R1_TURNS, R1_SEARCHER_TURNS):
        row = _frame(turns).iloc[0]
        assert row["text_adjacent_think"] == (
            "Who wrote Hamlet? [SEP] [PREV] I need the author. [PREV_SUBQ]  [SEP] [CURR] It is Shakespeare. "
            "[CURR_SUBQ] q1"
        )
        assert row["text_long_distance"] == (
            "Who wrote Hamlet? [SEP] [ORIG] I need the author. [SEP] [CURR_SUBQ] q1 [CURR] It is Shakespeare."
        )


def test_raw_reasoning_keeps_the_whole_turn():
    row = _frame(SEARCH_R1_TURNS, reasoning="raw").iloc[0]
    assert row["text_long_distance"].endswith("[CURR] " + SEARCH_R1_TURNS[1])
