import pytest

from raypipe.core.metrics import exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    "rule,text,expected",
    [
        ("squad", "The  Cat!", "cat"),
        ("squad", "An apple, a pear", "apple pear"),
        ("squad", "New-York", "newyork"),
        ("hotpotqa", "New-York", "newyork"),
        ("r1searcher", "New-York", "new york"),  # punctuation becomes a space
        ("squad", "New_York", "newyork"),
        ("r1searcher", "New_York", "new york"),
        ("r1searcher", "rock ‘n’ roll", "rock n roll"),
        ("squad", "True", "true"),
        ("r1searcher", "True", "yes"),  # exact string only
        ("r1searcher", "true", "true"),
        ("hotpotqa", "Theatre", "theatre"),  # articles only as whole words
    ],
)
def test_normalize_answer(rule, text, expected):
    assert normalize_answer(text, rule) == expected


@pytest.mark.parametrize(
    "prediction,golds,squad,hotpotqa,r1searcher",
    [
        # The yes/no rule: SQuAD gives partial credit, HotpotQA and R1-Searcher give none.
        ("yes it is", ["yes"], 0.5, 0.0, 0.0),
        ("no", ["no way"], 2 / 3, 0.0, 0.0),
        ("noanswer", ["no answer"], 0.0, 0.0, 0.0),
        # True/False mapping: only R1-Searcher.
        ("True", ["yes"], 0.0, 0.0, 1.0),
        ("False", ["no"], 0.0, 0.0, 1.0),
        # Punctuation to space vs removed.
        (
            "Greenwich Village New-York City",
            ["Greenwich Village, New York City"],
            2 * 0.75 * 0.6 / 1.35,
            2 * 0.75 * 0.6 / 1.35,
            1.0,
        ),
        # Articles and case.
        ("the Eiffel tower", ["Eiffel Tower"], 1.0, 1.0, 1.0),
        # Maximum over golden answers.
        ("chief of protocol", ["Ambassador", "Chief of Protocol"], 1.0, 1.0, 1.0),
        # Partial overlap: P = 1/2, R = 1/3.
        ("Tim Burton", ["director Tim Smith"], 0.4, 0.4, 0.4),
        ("", ["Paris"], 0.0, 0.0, 0.0),
    ],
)
def test_f1_rules(prediction, golds, squad, hotpotqa, r1searcher):
    assert f1_score(prediction, golds, "squad") == pytest.approx(squad)
    assert f1_score(prediction, golds, "hotpotqa") == pytest.approx(hotpotqa)
    assert f1_score(prediction, golds, "r1searcher") == pytest.approx(r1searcher)


def test_default_rule_is_hotpotqa():
    assert f1_score("yes it is", ["yes"]) == 0.0


def test_exact_match():
    assert exact_match("The Beatles.", ["beatles"]) == 1.0
    assert exact_match("Beatles band", ["beatles"]) == 0.0
    assert exact_match("True", ["yes"], "r1searcher") == 1.0
    assert exact_match("True", ["yes"], "squad") == 0.0
    assert exact_match(None, ["x"]) == 0.0


def test_missing_prediction_scores_zero():
    assert f1_score(None, ["Paris"]) == 0.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown metric rule"):
        f1_score("a", ["a"], "bleu")
    with pytest.raises(ValueError, match="golden_answers is empty"):
        f1_score("a", [])
