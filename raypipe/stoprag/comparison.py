"""Stop-RAG's comparison on the test questions: the controllers, their summary rows and the files they fill.

Natural stopping, Cap@k and the 4-state heuristic (:func:`baseline_controllers`) beside the trained
networks and LLM-Stop, each replayed over the same rescored trajectories (:func:`comparison_rows`);
:func:`write_comparison` writes ``comparison.csv``/``.md``/``.png`` (with each controller's paired tests against
natural stopping when given: :mod:`raypipe.analysis.policy_tests`) and ``outcomes.parquet``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from raypipe.core.config import RunConfig
from raypipe.core.rundir import RunDir
from raypipe.core.tables import frame_markdown
from raypipe.stopping.caps import cap, natural
from raypipe.stopping.replay import OfflineController, Trajectory, outcome_rows, replay, summarise
from raypipe.stopping.tradeoff import PValues, plot_caps, save_tradeoff, with_pvalue_cells


def baseline_controllers(
    run: RunDir, config: RunConfig, test_t: list[Trajectory]
) -> tuple[dict[str, tuple[OfflineController, str]], dict[str, set[str]]]:
    """Natural stopping, Cap@k up to the longest test trajectory and, when predictions/ exists, the
    4-state heuristic; with the questions the heuristic covers."""
    controllers: dict[str, tuple[OfflineController, str]] = {"natural": (natural, "")}
    for k in range(1, max(t.n_iterations for t in test_t) + 1):
        controllers[f"cap@{k}"] = (cap(k), "")
    covered: dict[str, set[str]] = {}
    heuristic = heuristic_controller(run, config)
    if heuristic is not None:
        th = config.stopping
        controllers["heuristic"] = (heuristic[0], f"4-state, θ_P={th.theta_p}, θ_U={th.theta_u}")
        covered["heuristic"] = heuristic[1]
    return controllers, covered


def heuristic_controller(run: RunDir, config: RunConfig) -> tuple[OfflineController, set[str]] | None:
    """The 4-state heuristic at the online controller's thresholds (``stopping.theta_p/theta_u``, the
    paper's by default) over the run's predictions, and the questions they cover; None when the
    predictors have not run."""
    if not run.has("predictions"):
        return None
    from raypipe.stopping.grid import predictions_by_head
    from raypipe.stopping.heuristic import Thresholds, replay_controller

    heads = predictions_by_head(run.read("predictions"))
    if len(heads) != 1:
        raise ValueError(f"predictions/ holds {len(heads)} heads; expected the chosen one only")
    (preds,) = heads.values()
    return replay_controller(preds, Thresholds(config.stopping.theta_p, config.stopping.theta_u)), set(preds)


def comparison_rows(
    test_t: list[Trajectory],
    controllers: dict[str, tuple[OfflineController, str]],
    covered: dict[str, set[str]] | None = None,
) -> tuple[list[dict], list[dict]]:
    """Summary rows and per-question outcomes; ``covered`` limits a controller to the questions it has
    inputs for (trajectories without retrieval need none)."""
    rows, outcomes = [], []
    for name, (controller, note) in controllers.items():
        qids = (covered or {}).get(name)
        outs = replay([t for t in test_t if qids is None or t.qid in qids or t.n_iterations == 0], controller)
        rows.append({**summarise(name, outs).row(), "note": note})
        outcomes.extend(outcome_rows(name, outs))
    return rows, outcomes


def markdown(table: pd.DataFrame, title: str, pvalues: PValues | None = None) -> str:
    """The comparison in Markdown; with ``pvalues``, each controller's paired tests against natural stopping."""
    columns = [
        "controller",
        "questions",
        "mean iterations",
        "vs natural",
        "mean F1",
        "share of natural F1",
        "tokens saved",
        "note",
    ]
    rows = [
        (
            r.controller,
            r.questions,
            f"{r.mean_iterations:.3f}",
            f"{100 * r.iterations_change:+.1f}%",
            f"{r.mean_f1:.3f}",
            f"{100 * r.f1_share:.1f}%",
            f"{100 * r.tokens_saved:+.1f}%",
            r.note,
        )
        for r in table.itertuples(index=False)
    ]
    shown = with_pvalue_cells(pd.DataFrame(rows, columns=columns), pvalues, after="tokens saved")
    note = f"\n{pvalues.note}\n" if pvalues is not None else ""
    body = frame_markdown(shown)
    return f"{title.replace(chr(10), ' ')}\n\n{body}\n{note}"


def plot(table: pd.DataFrame, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_caps(ax, table)
    others = table[~table["controller"].str.startswith("cap@")]
    markers = "*oD^v<>Ph"
    for i, r in enumerate(others.itertuples()):  # shrinking sizes keep coinciding points visible
        ax.scatter(
            r.mean_iterations,
            r.mean_f1,
            marker=markers[i % len(markers)],
            s=max(30, 260 - 45 * i),
            zorder=5 + i,
            edgecolors="k",
            linewidths=0.5,
            label=f"{r.controller} (n={r.questions})",
        )
    return save_tradeoff(fig, ax, path, title, legend_loc="best")


def write_comparison(
    out: Path,
    rows: list[dict],
    outcomes: list[dict],
    n_test: int,
    n_val: int,
    answers_note: str,
    protocol: str = "",
    pvalues: PValues | None = None,
) -> pd.DataFrame:
    """comparison.csv/.md/.png and outcomes.parquet; returns the comparison table. ``answers_note``
    names the answer generator that scored every controller (an ``answers`` column, a line of the .md);
    ``protocol`` the train/test protocol (a ``protocol`` column, a line of the .md); ``pvalues`` each row's
    paired tests against natural stopping (columns of the .csv and the .md)."""
    table = pd.DataFrame(rows)
    csv = table.assign(answers=answers_note, protocol=protocol)
    if pvalues is not None:
        csv = pd.concat([csv, pvalues.numbers.set_axis(csv.index)], axis=1)
    csv.to_csv(out / "comparison.csv", index=False)
    title = (
        f"Stopping controllers on {n_test} held-out test questions\n"
        f"(Stop-RAG threshold tuned on {n_val} validation questions)"
    )
    more = f"\n{protocol}.\n" if protocol else ""
    (out / "comparison.md").write_text(
        markdown(table, title, pvalues) + f"\nF1 of every controller: {answers_note}.\n" + more
    )
    plot(table, out / "comparison.png", title)
    pd.DataFrame(outcomes).to_parquet(out / "outcomes.parquet")
    return table
