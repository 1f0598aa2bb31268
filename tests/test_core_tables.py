"""The one Markdown table writer: layout, escaping, and the tables written through it."""

import pandas as pd

from raypipe.core.tables import frame_markdown, markdown_table


def test_pipe_table_layout():
    assert markdown_table(["a", "b"], [(1, 2.5), ("x", None)]) == "| a | b |\n|---|---|\n| 1 | 2.5 |\n| x | None |"
    assert markdown_table(["only"], []) == "| only |\n|---|"


def test_cells_never_break_the_table():
    assert markdown_table(["a|b"], [["line\nbreak | pipe"]]) == "| a\\|b |\n|---|\n| line break \\| pipe |"


def test_frame_markdown_writes_cells_as_they_are():
    frame = pd.DataFrame({"name": ["x", ""], "n": [1, 2]})
    assert frame_markdown(frame) == "| name | n |\n|---|---|\n| x | 1 |\n|  | 2 |"


def test_stoprag_comparison_escapes_a_note_with_a_pipe():
    from raypipe.stoprag.comparison import markdown

    row = {
        "controller": "stoprag",
        "questions": 4,
        "mean_iterations": 1.0,
        "iterations_change": -0.25,
        "mean_f1": 0.5,
        "f1_share": 0.9,
        "tokens_saved": 0.1,
        "note": "q-net | tuned",
    }
    text = markdown(pd.DataFrame([row]), "Title\nmore")
    assert text.splitlines()[0] == "Title more"
    assert text.splitlines()[-1] == "| stoprag | 4 | 1.000 | -25.0% | 0.500 | 90.0% | +10.0% | q-net \\| tuned |"
