"""The trade-off between iterations and answer quality: tables and the paper's Figure 5."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raypipe.core.config import PAPER_F1_SHARE, PAPER_ITERATIONS_CHANGE
from raypipe.core.tables import frame_markdown
from raypipe.stopping.grid import beats_paper
from raypipe.stopping.heuristic import PAPER_THRESHOLDS

TABLE_COLUMNS = [
    "controller",
    "feature_group",
    "window",
    "variant",
    "theta_p",
    "theta_u",
    "selection",
    "questions",
    "mean_iterations",
    "iterations_change",
    "mean_f1",
    "f1_share",
    "mean_tokens",
    "tokens_saved",
    "val_iterations_change",
    "val_f1_share",
    "all_iterations_change",
    "all_f1_share",
    "beats_paper",
    "note",
]


@dataclass(frozen=True)
class PValues:
    """Paired tests against natural stopping for each row of a table (:mod:`raypipe.analysis.policy_tests` makes
    them): ``numbers``, corrected p-values for the CSV, and ``cells``, the same formatted for the Markdown, one
    row per table row in its order; ``note`` names the tests and the correction."""

    numbers: pd.DataFrame
    cells: pd.DataFrame
    note: str


def with_pvalue_cells(shown: pd.DataFrame, pvalues: PValues | None, after: str) -> pd.DataFrame:
    """``shown`` (a formatted table) with the p-value cells inserted after its column ``after``."""
    if pvalues is None:
        return shown
    at = shown.columns.get_loc(after) + 1
    cells = pvalues.cells.set_axis(shown.index)
    return pd.concat([shown.iloc[:, :at], cells, shown.iloc[:, at:]], axis=1)


def table_row(
    controller: str, metrics: pd.Series, val: pd.Series | None = None, every: pd.Series | None = None, **labels
) -> dict:
    """One row: test metrics, validation figures, and ``every``: all questions (cross-fitted for chosen θ)."""
    row = {
        "controller": controller,
        **labels,
        "questions": int(metrics["n"]),
        **{
            k: float(metrics[k])
            for k in ("mean_iterations", "iterations_change", "mean_f1", "f1_share", "mean_tokens", "tokens_saved")
        },
        "val_iterations_change": float(val["iterations_change"]) if val is not None else float("nan"),
        "val_f1_share": float(val["f1_share"]) if val is not None else float("nan"),
        "all_iterations_change": float(every["iterations_change"]) if every is not None else float("nan"),
        "all_f1_share": float(every["f1_share"]) if every is not None else float("nan"),
    }
    row["beats_paper"] = beats_paper(row["iterations_change"], row["f1_share"])
    return row


def to_frame(rows: Sequence[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows).reindex(columns=TABLE_COLUMNS)


def summary(rows: dict[str, pd.Series | dict], questions: dict[str, int], min_f1_share: float) -> str:
    """A paragraph: natural stopping, the named operating points, and the comparison with the paper's."""

    def point(r) -> str:
        text = (
            f"{r['mean_iterations']:.3f} iterations ({100 * r['iterations_change']:+.2f}%), F1 {r['mean_f1']:.3f} "
            f"({100 * r['f1_share']:.2f}% of natural)"
        )
        if not pd.isna(r.get("all_iterations_change")):
            text += (
                f"; over all questions, cross-fitted: {100 * r['all_iterations_change']:+.2f}% at "
                f"{100 * r['all_f1_share']:.2f}%"
            )
        return text

    nat = rows["natural"]
    lines = [
        (
            f"{questions['test']} test questions; thresholds chosen on {questions['val']} validation questions as the "
            f"fewest iterations keeping at least {100 * min_f1_share:.1f}% of natural F1."
        ),
        f"Natural stopping: {nat['mean_iterations']:.3f} iterations, F1 {nat['mean_f1']:.3f}.",
    ]
    for label, key in (
        (f"Paper's heuristic at the paper's θ ({PAPER_THRESHOLDS.theta_p}, {PAPER_THRESHOLDS.theta_u})", "paper"),
        ("Paper's heuristic, θ chosen on validation", "faithful"),
        ("Best configuration on validation", "best"),
    ):
        if key in rows:
            lines.append(f"{label}: {point(rows[key])}.")
    best = rows["best"]
    verdict = "beats" if beats_paper(best["iterations_change"], best["f1_share"]) else "does not beat"
    lines.append(
        f"The paper's operating point is {100 * PAPER_ITERATIONS_CHANGE:+.2f}% iterations at "
        f"{100 * PAPER_F1_SHARE:.2f}% of natural F1; on test questions the best configuration {verdict} it "
        f"({100 * (best['iterations_change'] - PAPER_ITERATIONS_CHANGE):+.2f} points of iterations, "
        f"{100 * (best['f1_share'] - PAPER_F1_SHARE):+.2f} points of F1 share)."
    )
    return " ".join(lines)


def markdown(table: pd.DataFrame, intro: str = "", pvalues: PValues | None = None) -> str:
    """The trade-off table in Markdown (percentages for the ratios), after a heading and ``intro``; with
    ``pvalues``, the paired tests against natural stopping beside the test figures."""
    shown = table[TABLE_COLUMNS].copy()
    for col in ("iterations_change", "tokens_saved", "val_iterations_change", "all_iterations_change"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{100 * v:+.2f}%")
    for col in ("f1_share", "val_f1_share", "all_f1_share"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{100 * v:.2f}%")
    for col in ("mean_iterations", "mean_f1", "theta_p", "theta_u"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    shown["mean_tokens"] = shown["mean_tokens"].map(lambda v: f"{v:.0f}")
    shown["window"] = shown["window"].map(lambda v: "" if pd.isna(v) else str(int(v)))
    shown = with_pvalue_cells(shown.fillna(""), pvalues, after="tokens_saved")
    note = (
        f"\nTest questions. Paper's operating point: {100 * PAPER_ITERATIONS_CHANGE:+.2f}% iterations at "
        f"{100 * PAPER_F1_SHARE:.1f}% of natural F1; beats_paper = fewer iterations at no less F1 share (on test). "
        "val_*: the validation half; all_*: every question, chosen thresholds cross-fitted (each half scored "
        "with the thresholds chosen on the other)." + (f" {pvalues.note}" if pvalues is not None else "") + "\n"
    )
    top = f"# Early stopping: iterations vs F1 on held-out questions\n\n{intro}\n\n" if intro else ""
    return top + frame_markdown(shown) + "\n" + note


def figure5(
    path: Path,
    grid_points: pd.DataFrame,
    front: pd.DataFrame,
    baselines: pd.DataFrame,
    marked: pd.DataFrame,
    title: str,
    envelope: pd.DataFrame | None = None,
) -> Path:
    """Mean iterations vs mean F1 (test): the grid, its Pareto front, natural, Cap@k and marked points.

    ``envelope``: the Pareto front over every head and variant swept, for comparison.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter(grid_points["mean_iterations"], grid_points["mean_f1"], s=8, c="0.75", label="θ grid (paper heuristic)")
    ax.plot(front["mean_iterations"], front["mean_f1"], "-", c="tab:orange", lw=1.5, label="Pareto front")
    if envelope is not None:
        ax.plot(
            envelope["mean_iterations"],
            envelope["mean_f1"],
            ":",
            c="tab:green",
            lw=1.5,
            label="Pareto front, all heads and variants",
        )
    plot_caps(ax, baselines)
    nat = baselines[baselines["controller"] == "natural"]
    ax.scatter(nat["mean_iterations"], nat["mean_f1"], marker="*", s=160, c="k", zorder=5, label="natural")
    markers = "o^vD<>Ph"
    for i, (_, r) in enumerate(marked.iterrows()):
        ax.scatter(
            r["mean_iterations"], r["mean_f1"], marker=markers[i % len(markers)], s=60, zorder=6, label=r["label"]
        )
    return save_tradeoff(fig, ax, path, title, legend_loc="lower right")


def plot_caps(ax, table: pd.DataFrame) -> None:
    """The Cap@k baselines of a comparison table as one labelled dashed line."""
    caps = table[table["controller"].str.startswith("cap@")]
    ax.plot(caps["mean_iterations"], caps["mean_f1"], "s--", c="tab:blue", ms=5, label="Cap@k")
    for _, r in caps.iterrows():
        ax.annotate(
            r["controller"].removeprefix("cap@"),
            (r["mean_iterations"], r["mean_f1"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )


def save_tradeoff(fig, ax, path: Path, title: str, legend_loc: str) -> Path:
    """Axes, title, grid and legend of an iterations-vs-F1 figure, written to ``path``."""
    import matplotlib.pyplot as plt

    ax.set_xlabel("mean retrieval iterations (cost counted to the decision)")
    ax.set_ylabel("mean F1")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc=legend_loc)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
