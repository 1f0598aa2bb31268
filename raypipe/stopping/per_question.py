"""Per-question outcomes of the policies in the sweep's trade-off table, for paired tests against natural stopping.

The trade-off table gives each policy's means over the test questions; a paired test needs every test
question's outcome under every row's policy. :func:`row_controller` rebuilds a row's policy from the row
(natural stopping, Cap@k, a heuristic variant on its head at fixed thresholds or at the thresholds chosen on
validation, one per dataset for a ``per_dataset`` choice) and :func:`tradeoff_outcomes` replays each on the test
questions with :func:`~raypipe.stopping.replay.replay`, the scoring the grid's sums come from: the means of a
row's outcomes are the row's figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from raypipe.stopping.caps import cap, natural
from raypipe.stopping.grid import HeadKey, head_name
from raypipe.stopping.heuristic import VARIANTS, HeuristicOptions, Predictions, Thresholds, replay_controller
from raypipe.stopping.replay import OfflineController, Trajectory, outcome_rows, replay
from raypipe.stopping.selection import BASELINE_SELECTION, FIXED_SELECTION


def policy_label(row: pd.Series) -> str:
    """A row's policy in a few words: ``cap@2``, ``heuristic[paper] g/w3 θ=(0.3, 0.2)``, ``... per_dataset``."""
    if row["selection"] == BASELINE_SELECTION:
        return str(row["controller"])
    head = head_name((row["feature_group"], int(row["window"])))
    if row["selection"] == FIXED_SELECTION:
        return f"{row['controller']} {head} θ=({row['theta_p']:g}, {row['theta_u']:g})"
    return f"{row['controller']} {head} {row['selection']}"


def policy_labels(table: pd.DataFrame) -> list[str]:
    """One label per row, in order; a repeated label gets ``#2``, ``#3``."""
    labels: list[str] = []
    for _, row in table.iterrows():
        label = policy_label(row)
        repeats = sum(1 for seen in labels if seen == label or seen.startswith(f"{label} #"))
        labels.append(f"{label} #{repeats + 1}" if repeats else label)
    return labels


def per_dataset_controller(
    predictions: Predictions, chosen: Mapping[str, Thresholds], options: HeuristicOptions
) -> OfflineController:
    """The heuristic with each dataset's thresholds (``"*"`` for the others), as
    :func:`~raypipe.stopping.grid.score_choice` scores a choice."""
    controllers = {dataset: replay_controller(predictions, th, options) for dataset, th in chosen.items()}
    return lambda trajectory: controllers.get(trajectory.dataset, controllers["*"])(trajectory)


def row_controller(
    row: pd.Series, heads: Mapping[HeadKey, Predictions], thresholds: Mapping[tuple, Mapping[str, Thresholds]]
) -> OfflineController:
    """The policy of one trade-off table row. ``heads``: predictions by (feature group, window), refits
    included; ``thresholds``: the validation choices by (group, window, variant, selection)."""
    if row["selection"] == BASELINE_SELECTION:
        return natural if row["controller"] == "natural" else cap(int(str(row["controller"]).removeprefix("cap@")))
    key = (row["feature_group"], int(row["window"]))
    if key not in heads:
        raise ValueError(f"no predictions of the head {head_name(key)} for the row {policy_label(row)!r}")
    options = VARIANTS[row["variant"]]
    if row["selection"] == FIXED_SELECTION:
        return replay_controller(heads[key], Thresholds(float(row["theta_p"]), float(row["theta_u"])), options)
    return per_dataset_controller(heads[key], thresholds[(*key, row["variant"], row["selection"])], options)


def tradeoff_outcomes(
    table: pd.DataFrame,
    trajectories: Sequence[Trajectory],
    split_of: Mapping[str, str],
    heads: Mapping[HeadKey, Predictions],
    thresholds: Mapping[tuple, Mapping[str, Thresholds]],
) -> pd.DataFrame:
    """Every row's policy replayed on the test questions: one row per policy and question, the policy's
    label (:func:`policy_labels`) in ``controller`` and the fields of :class:`~raypipe.stopping.replay.Outcome`."""
    test = [t for t in trajectories if split_of[t.qid] == "test"]
    rows = []
    for label, (_, row) in zip(policy_labels(table), table.iterrows()):
        rows += outcome_rows(label, replay(test, row_controller(row, heads, thresholds)))
    return pd.DataFrame(rows)
