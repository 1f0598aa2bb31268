"""Step 3 of ``raypipe sweep``: thresholds chosen on validation questions, scored on test, and the trade-off table.

:func:`choose` takes the sweep's grid (every head × variant × θ pair's outcome sums per split, from
:func:`raypipe.stopping.grid.evaluate_grid`) and picks, for every head and variant, the θ that keeps
``min_share`` of natural F1 on validation with the fewest iterations (one θ, or one per dataset); the table
shows them on test next to natural stopping, Cap@k and the paper's heuristic at fixed θ.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from raypipe.core.config import PAPER_THETA_U_STRICT
from raypipe.stopping.grid import aggregate, baseline_rows, choose_thresholds, controller_rows, cross_fit, score_choice
from raypipe.stopping.heuristic import PAPER_THRESHOLDS, Thresholds, replay_controller
from raypipe.stopping.inputs import SweepInputs
from raypipe.stopping.tradeoff import table_row, to_frame

# The paper's heuristic at fixed thresholds in the table: the paper's θ, and a stricter θ_U beside it.
FIXED_THRESHOLDS = (PAPER_THRESHOLDS, Thresholds(PAPER_THRESHOLDS.theta_p, PAPER_THETA_U_STRICT))
# The table's ``selection`` column: how a row's policy was set (besides "global" and "per_dataset" choices).
BASELINE_SELECTION = "baseline"  # natural stopping and Cap@k
FIXED_SELECTION = "paper θ"  # the heuristic at one of FIXED_THRESHOLDS


@dataclass
class Choices:
    """What the sweep chose on validation questions, scored on test."""

    table: pd.DataFrame  # the trade-off table shown
    rows: list[dict]  # baselines, fixed θ and every validation choice (selections.csv)
    base_test: pd.DataFrame  # natural stopping and Cap@k on test, one row per controller
    paper: dict  # the paper's heuristic at the paper's θ
    faithful: pd.Series  # the paper's heuristic on the chosen head, one θ chosen on validation
    best: pd.Series  # the best validation choice over heads × variants × selections
    thresholds: dict[tuple, dict[str, Thresholds]]  # (group, window, variant, selection) -> chosen θ


def _baseline_rows(inputs: SweepInputs) -> tuple[pd.DataFrame, list[dict]]:
    """Natural stopping and Cap@k: their test metrics (one row per controller) and their table rows."""
    base = pd.DataFrame(baseline_rows(inputs.trajectories, inputs.split_of))
    base_test = aggregate(base[base["split"] == "test"], ["controller"])
    base_val = aggregate(base[base["split"] == "val"], ["controller"]).set_index("controller")
    base_all = aggregate(base, ["controller"]).set_index("controller")
    rows = [
        table_row(
            r["controller"],
            r,
            base_val.loc[r["controller"]],
            base_all.loc[r["controller"]],
            selection=BASELINE_SELECTION,
        )
        for _, r in base_test.iterrows()
    ]
    return base_test, rows


def _fixed_rows(inputs: SweepInputs) -> list[dict]:
    """The paper's heuristic on the chosen head at :data:`FIXED_THRESHOLDS`, in that order."""
    group, window = inputs.chosen_head
    rows = []
    for th in FIXED_THRESHOLDS:
        controller = replay_controller(inputs.chosen, th)
        fixed = pd.DataFrame(controller_rows(inputs.trajectories, controller, inputs.split_of, controller="fixed"))
        test, val = (aggregate(fixed[fixed["split"] == s], ["controller"]).iloc[0] for s in ("test", "val"))
        every = aggregate(fixed, ["controller"]).iloc[0]
        rows.append(
            table_row(
                "heuristic[paper]",
                test,
                val,
                every,
                feature_group=group,
                window=window,
                variant="paper",
                theta_p=th.theta_p,
                theta_u=th.theta_u,
                selection=FIXED_SELECTION,
            )
        )
    return rows


def _selection_rows(grid: pd.DataFrame, min_share: float) -> tuple[list[dict], dict]:
    """Validation-chosen thresholds of every head × variant (global and per dataset), scored on test."""
    rows, choices = [], {}
    for (group, window, variant), part in grid.groupby(["feature_group", "window", "variant"], sort=False):
        for selection in ("global", "per_dataset"):
            per_dataset = selection == "per_dataset"
            chosen = choose_thresholds(part, min_share, per_dataset)
            val, test = score_choice(part, chosen, "val"), score_choice(part, chosen, "test")
            every = cross_fit(part, min_share, per_dataset)
            th = chosen["*"] if selection == "global" else None
            note = (
                ""
                if th
                else " ".join(f"{ds}:({t.theta_p:.3g},{t.theta_u:.3g})" for ds, t in chosen.items() if ds != "*")
            )
            rows.append(
                table_row(
                    f"heuristic[{variant}]",
                    test,
                    val,
                    every,
                    feature_group=group,
                    window=int(window),
                    variant=variant,
                    theta_p=th.theta_p if th else float("nan"),
                    theta_u=th.theta_u if th else float("nan"),
                    selection=selection,
                    note=note,
                )
            )
            choices[(group, int(window), variant, selection)] = chosen
    return rows, choices


def _tradeoff_table(
    rows: list[dict], faithful: pd.DataFrame, per_variant: pd.DataFrame, best: pd.Series
) -> pd.DataFrame:
    """The rows shown (baselines and fixed θ, the faithful choices, each variant's best), the best marked."""
    shown = pd.concat([to_frame(rows), faithful, per_variant])
    table = shown.drop_duplicates(subset=[c for c in shown.columns if c != "note"], keep="first").reset_index(drop=True)
    same = (
        table[["feature_group", "variant", "selection"]] == best[["feature_group", "variant", "selection"]].values
    ).all(axis=1)
    mark = same & (table["window"] == best["window"])
    table.loc[mark, "note"] = ("best on validation " + table.loc[mark, "note"].fillna("")).str.strip()
    return table


def choose(inputs: SweepInputs, grid: pd.DataFrame, min_share: float) -> Choices:
    """Step 3: thresholds chosen on validation for every head × variant, the best of them, the trade-off table.

    The best is the fewest validation iterations among the choices keeping ``min_share`` of natural F1
    on validation (the faithful heuristic's choices when none does).
    """
    base_test, rows = _baseline_rows(inputs)
    fixed = _fixed_rows(inputs)
    rows += fixed
    sel_rows, thresholds = _selection_rows(grid, min_share)
    sel = to_frame(sel_rows)
    group, window = inputs.chosen_head
    faithful = sel[(sel["feature_group"] == group) & (sel["window"] == window) & (sel["variant"] == "paper")]
    admissible = sel[sel["val_f1_share"].fillna(1.0) >= min_share]
    best = (
        (admissible if not admissible.empty else faithful)
        .sort_values(["val_iterations_change", "val_f1_share"], ascending=[True, False])
        .iloc[0]
    )
    per_variant = (
        admissible.sort_values(["val_iterations_change", "val_f1_share"], ascending=[True, False])
        .groupby("variant", sort=False)
        .head(1)
    )
    return Choices(
        table=_tradeoff_table(rows, faithful, per_variant, best),
        rows=rows + sel_rows,
        base_test=base_test,
        paper=fixed[0],
        faithful=faithful[faithful["selection"] == "global"].iloc[0],
        best=best,
        thresholds=thresholds,
    )
