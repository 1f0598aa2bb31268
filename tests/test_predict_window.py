import numpy as np
import pandas as pd
import pytest

from raypipe.predict.window import build_window, window_column_names, window_for_last


def _frame():
    # two trajectories; feature value = 10 * question + iteration, so every slot is identifiable
    rows = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]
    frame = pd.DataFrame(rows, columns=["qid", "iteration"])
    frame["f"] = [11.0, 12.0, 13.0, 21.0, 22.0]
    frame["g"] = -frame["f"]
    return frame.sample(frac=1.0, random_state=3).reset_index(drop=True)  # order must not matter


def broken_window(frame, columns, window):
    """The public sequential.py's behaviour: shifted copies merged back on the row key (every slot = now)."""
    values = frame[columns].to_numpy(float)
    out = np.full((len(frame), len(columns) * window + window - 1), np.nan)
    for k in range(window):
        present = (frame["iteration"].to_numpy() - k) >= 1
        out[present, k * len(columns) : (k + 1) * len(columns)] = values[present]
        if k:
            out[:, len(columns) * window + k - 1] = (~present).astype(float)
    return out, window_column_names(columns, window)


def check_true_window(builder):
    frame = _frame()
    x, names = builder(frame, ["f", "g"], 3)
    assert names == ["f@t-0", "g@t-0", "f@t-1", "g@t-1", "f@t-2", "g@t-2", "slot1_missing", "slot2_missing"]
    by_key = {(q, i): row for q, i, row in zip(frame["qid"], frame["iteration"], x)}
    np.testing.assert_array_equal(by_key[("a", 3)][:6], [13, -13, 12, -12, 11, -11])
    np.testing.assert_array_equal(by_key[("a", 3)][6:], [0, 0])
    np.testing.assert_array_equal(by_key[("b", 2)][:4], [22, -22, 21, -21])
    assert np.isnan(by_key[("b", 2)][4:6]).all()
    np.testing.assert_array_equal(by_key[("b", 2)][6:], [0, 1])
    assert np.isnan(by_key[("a", 1)][2:6]).all()
    np.testing.assert_array_equal(by_key[("a", 1)][6:], [1, 1])


def test_window_slides_over_previous_iterations():
    check_true_window(build_window)


def test_check_fails_on_the_public_codes_window():
    with pytest.raises(AssertionError):
        check_true_window(broken_window)


def test_window_one_is_the_row_itself():
    frame = _frame()
    x, names = build_window(frame, ["f"], 1)
    assert names == ["f@t-0"]
    np.testing.assert_array_equal(x[:, 0], frame["f"].to_numpy())


def test_gap_in_iterations_is_missing_not_shifted():
    frame = pd.DataFrame({"qid": ["a", "a"], "iteration": [1, 3], "f": [1.0, 3.0]})
    x, _ = build_window(frame, ["f"], 2)
    assert np.isnan(x[1, 1]) and x[1, 2] == 1


def test_online_window_matches_offline():
    frame = _frame()
    offline, _ = build_window(frame, ["f", "g"], 3)
    history = pd.concat(
        [pd.DataFrame({"qid": ["a"], "iteration": [0], "f": [99.0], "g": [99.0]}), frame[frame["qid"] == "a"]]
    )
    online = window_for_last(history, ["f", "g"], 3)
    row = offline[(frame["qid"] == "a").to_numpy() & (frame["iteration"] == 3).to_numpy()]
    np.testing.assert_array_equal(online, row)


def test_window_errors():
    frame = _frame()
    with pytest.raises(ValueError, match="missing from the table"):
        build_window(frame, ["nope"], 2)
    with pytest.raises(ValueError, match="duplicated"):
        build_window(pd.concat([frame, frame]), ["f"], 2)
    with pytest.raises(ValueError, match="iteration 1"):
        window_for_last(frame[frame["iteration"] == 0], ["f"], 2)
