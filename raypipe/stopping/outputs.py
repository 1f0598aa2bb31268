"""Step 4 of ``raypipe sweep``: what it writes in ``RUN_DIR/stopping/``.

``01_tradeoff.md``/``.csv`` (the trade-off table on test questions, with a summary against the paper's
operating point and, when given, each row's paired tests against natural stopping), ``02_figure5.png``,
``selected.json`` (the chosen configurations, loadable by
:meth:`raypipe.stopping.online.OnlineController.from_selected`), and in ``data/``: ``selections.csv`` (every
validation choice scored on test) and ``pareto.csv`` (the faithful heuristic's test front on the chosen head).
``03_significance.md``/``.csv`` (the paired tests in full) are :mod:`raypipe.analysis.policy_tests`'.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from raypipe.stopping.grid import aggregate, head_name, pareto_front
from raypipe.stopping.heuristic import PAPER_THRESHOLDS, VARIANTS, Thresholds
from raypipe.stopping.inputs import SweepInputs
from raypipe.stopping.selection import Choices
from raypipe.stopping.tradeoff import PValues, figure5, markdown, summary, to_frame

STOPPING_DIR = "stopping"
SELECTED = "selected.json"
TRADEOFF = "01_tradeoff"
FIGURE = "02_figure5.png"
SIGNIFICANCE = "03_significance"  # the paired tests in full (.md, .csv), written by raypipe.analysis.policy_tests
DATA = "data"


def _config_json(group: str, window: int, variant: str, chosen: dict[str, Thresholds]) -> dict:
    return {
        "feature_group": group,
        "window": window,
        "variant": variant,
        "thresholds": {ds: {"theta_p": th.theta_p, "theta_u": th.theta_u} for ds, th in chosen.items()},
    }


def _write_figure(out: Path, inputs: SweepInputs, grid: pd.DataFrame, choices: Choices) -> None:
    """data/pareto.csv (the faithful heuristic's test points on the chosen head) and Figure 5."""
    group, window = inputs.chosen_head
    faithful_grid = grid[(grid["feature_group"] == group) & (grid["window"] == window) & (grid["variant"] == "paper")]
    points = aggregate(faithful_grid[faithful_grid["split"] == "test"], ["theta_p", "theta_u"])
    front = pareto_front(points)
    front.to_csv(out / DATA / "pareto.csv", index=False)
    faithful, best = choices.faithful, choices.best
    marked = pd.DataFrame(
        [
            {**choices.paper, "label": f"paper θ=({PAPER_THRESHOLDS.theta_p}, {PAPER_THRESHOLDS.theta_u})"},
            {
                **faithful.to_dict(),
                "label": f"paper heuristic, val-chosen θ=({faithful['theta_p']:.3g}, {faithful['theta_u']:.3g})",
            },
            {
                **best.to_dict(),
                "label": (
                    f"best on val: {best['variant']} {best['feature_group']}/w{int(best['window'])} "
                    f"({best['selection']})"
                ),
            },
        ]
    )
    everything = aggregate(grid[grid["split"] == "test"], ["feature_group", "window", "variant", "theta_p", "theta_u"])
    title = f"Iterations vs F1 on {inputs.questions['test']} test questions ({head_name(inputs.chosen_head)})"
    figure5(out / FIGURE, points, front, choices.base_test, marked, title, envelope=pareto_front(everything))


def write_outputs(
    out: Path,
    inputs: SweepInputs,
    grid: pd.DataFrame,
    choices: Choices,
    min_share: float,
    pvalues: PValues | None = None,
) -> dict:
    """Step 4: the tables, the Pareto front, Figure 5, selected.json and the Markdown trade-off; returns selected.
    ``pvalues``: the trade-off rows' paired tests against natural stopping (columns of the CSV and the Markdown)."""
    to_frame(choices.rows).assign(protocol=inputs.protocol).to_csv(out / DATA / "selections.csv", index=False)
    table = choices.table.assign(protocol=inputs.protocol)
    if pvalues is not None:
        table = pd.concat([table, pvalues.numbers.set_axis(table.index)], axis=1)
    table.to_csv(out / f"{TRADEOFF}.csv", index=False)
    _write_figure(out, inputs, grid, choices)
    group, window = inputs.chosen_head
    best = choices.best
    key_best = (best["feature_group"], int(best["window"]), best["variant"], best["selection"])
    selected = {
        "paper": _config_json(group, window, "paper", {"*": PAPER_THRESHOLDS}),
        "faithful": _config_json(group, window, "paper", choices.thresholds[(group, window, "paper", "global")]),
        "best": _config_json(*key_best[:3], choices.thresholds[key_best]),
        "min_f1_share": min_share,
        "questions": inputs.questions,
        "protocol": inputs.protocol,
        "excluded": inputs.excluded,
        "variants": {name: vars(opts) for name, opts in VARIANTS.items()},
    }
    (out / SELECTED).write_text(json.dumps(selected, indent=2, default=str))
    named = {
        "natural": choices.base_test.set_index("controller").loc["natural"],
        "paper": choices.paper,
        "faithful": choices.faithful,
        "best": best,
    }
    intro = f"{summary(named, inputs.questions, min_share)}\n\n{inputs.protocol}."
    (out / f"{TRADEOFF}.md").write_text(markdown(choices.table, intro, pvalues))
    return selected


def output_files(out: Path) -> list[Path]:
    """The files a reader (or experiment tracking) takes from ``RUN_DIR/stopping/``."""
    return [out / f"{stem}{suffix}" for stem in (TRADEOFF, SIGNIFICANCE) for suffix in (".md", ".csv")] + [
        out / FIGURE,
        out / SELECTED,
    ]


def headline_figures(table: pd.DataFrame) -> dict[str, float]:
    """Natural stopping's and the best validation choice's test figures, and the test questions."""
    figures = {"test_questions": float(table["questions"].max())}
    best = table[table["note"].fillna("").str.startswith("best on validation")]
    for name, rows in (("natural", table[table["controller"] == "natural"]), ("best", best)):
        for key in ("mean_f1", "f1_share", "mean_iterations", "iterations_change", "tokens_saved"):
            if not rows.empty:
                figures[f"{name}.{key}"] = float(rows.iloc[0][key])
    return figures
