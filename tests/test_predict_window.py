import numpy as np
import pandas as pd
import pytest

from raypipe.core.config import TrainConfig
from raypipe.predict.window import TYPE_COLUMN, build_window, head_inputs, window_column_names, window_for_last


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


def test_seed_public_window_repeats_the_current_row():
    """DanielTian97/agentic_rag_predictions predictions/prediction_head/sequential.py,
    build_sequential_dataframe: each copy shifts sub_qid by i + 1 - window_size and blanks the slots
    whose shifted sub_qid < 0, then merges back on the per-iteration qid, so every kept slot is the
    current row's; ``slots="seed_public"`` is that window, the default the correct one."""
    frame = _frame()
    x, names = build_window(frame, ["f", "g"], 3, slots="seed_public")
    expected, expected_names = broken_window(frame, ["f", "g"], 3)
    np.testing.assert_array_equal(x, expected)
    assert names == expected_names
    gap = pd.DataFrame({"qid": ["a", "a"], "iteration": [1, 3], "f": [1.0, 3.0]})
    assert build_window(gap, ["f"], 2, slots="seed_public")[0][1, 1] == 3.0  # never looked up: the row itself
    with pytest.raises(ValueError, match="slots"):
        build_window(frame, ["f"], 2, slots="shifted")


def test_seed_input_has_no_missing_value_indicators():
    """mlp.py / sequential.py: the window's columns are the signals only (NaN where a slot is before
    the trajectory start, set to 0 by the head's imputer); train.head_input=seed is the default."""
    frame = _frame()
    x, names = head_inputs(frame, ["f", "g"], 3, TrainConfig(include_type=False))
    assert names == ["f@t-0", "g@t-0", "f@t-1", "g@t-1", "f@t-2", "g@t-2"] and x.shape == (len(frame), 6)
    with_flags, flag_names = head_inputs(frame, ["f", "g"], 3, TrainConfig(head_input="indicators", include_type=False))
    np.testing.assert_array_equal(with_flags[:, :6], x)
    assert flag_names[6:] == ["slot1_missing", "slot2_missing"]


def test_type_one_hot_over_every_row():
    """prediction_head/train.py prepare_prediction_head_data(include_type=True) and sequential.py:
    pd.get_dummies(seq_df, columns=["type"]) over training and test rows together, booleans as ints,
    appended after the window columns; a question without a type has zeros."""
    frame = _frame()
    frame[TYPE_COLUMN] = frame["qid"].map({"a": "bridge"})
    frame.loc[(frame["qid"] == "a") & (frame["iteration"] == 2), TYPE_COLUMN] = "comparison"
    x, names = head_inputs(frame, ["f"], 1, TrainConfig())
    assert names == ["f@t-0", "type_bridge", "type_comparison"]
    dummies = pd.get_dummies(frame[TYPE_COLUMN], prefix="type").astype(int)
    np.testing.assert_array_equal(x[:, 1:], dummies[["type_bridge", "type_comparison"]].to_numpy())
    assert (x[(frame["qid"] == "b").to_numpy(), 1:] == 0).all()
    _, without = head_inputs(frame, ["f"], 1, TrainConfig(include_type=False))
    assert without == ["f@t-0"]
