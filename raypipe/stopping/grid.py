"""Sweeps of the 4-state heuristic: thresholds × heuristic variants × prediction heads (the pure maths).

Pure core: :func:`evaluate_grid` replays every (variant, θ_P, θ_U) on every question and keeps the
outcome sums per split (validation / test, by qid) and dataset, so that any selection, global or per
dataset, is a sum over rows. :func:`select` chooses thresholds on validation questions: the fewest
mean iterations among the points that keep at least ``min_f1_share`` of natural F1 (the paper's
operating point kept 97.6%). Choices are reported on test questions.

The sweep job (``raypipe.stages.sweep``) runs :func:`evaluate_grid` once per prediction head as a Ray
Tune trial.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from raypipe.core.config import PAPER_F1_SHARE, PAPER_ITERATIONS_CHANGE
from raypipe.stopping.caps import cap, natural
from raypipe.stopping.heuristic import VARIANTS, Predictions, Thresholds, classified_signals, replay_controller
from raypipe.stopping.replay import OfflineController, Outcome, Trajectory, outcome, relative_change, replay, share

HeadKey = tuple[str, int]  # (feature_group, window)
SUMS = ("iterations", "f1", "tokens", "natural_iterations", "natural_f1", "natural_tokens")


def head_name(head: HeadKey) -> str:
    return f"{head[0]}/w{head[1]}"


def predictions_by_head(table: pa.Table) -> dict[HeadKey, Predictions]:
    """Group a PREDICTIONS-schema table into qid -> iteration -> (P̂, Û), one mapping per head."""
    cols = table.select(["qid", "iteration", "feature_group", "window", "p_hat", "u_hat"]).to_pydict()
    heads: dict[HeadKey, dict[str, dict[int, tuple[float, float | None]]]] = {}
    for qid, it, group, window, p, u in zip(*cols.values()):
        if p is None or u is None:
            raise ValueError(f"prediction for {qid} iteration {it} ({group}/w{window}) is missing p_hat or u_hat")
        per_q = heads.setdefault((group, int(window)), {}).setdefault(qid, {})
        if it in per_q:
            raise ValueError(f"duplicate prediction for {qid} iteration {it} ({group}/w{window})")
        per_q[int(it)] = (float(p), float(u))
    return dict(heads)  # typed dict[HeadKey, Predictions]: the inner dicts as read-only mappings


def threshold_grid(base: Sequence[float], values: Iterable[float], quantile_points: int) -> list[float]:
    """The configured grid plus ``quantile_points`` evenly spaced inner quantiles of ``values``."""
    grid = {round(float(v), 6) for v in base}
    vals = np.asarray(list(values), dtype=float)
    if quantile_points and vals.size:
        qs = np.linspace(0, 1, quantile_points + 2)[1:-1]
        grid |= {round(float(v), 4) for v in np.quantile(vals, qs)}
    return sorted(grid)


def outcome_sums(outcomes: Iterable[Outcome], split_of: Mapping[str, str]) -> list[dict]:
    """Outcome sums per (split, dataset): n and the :data:`SUMS` columns."""
    acc: dict[tuple[str, str], dict] = {}
    for o in outcomes:
        key = (split_of[o.qid], o.dataset)
        row = acc.setdefault(key, {"split": key[0], "dataset": key[1], "n": 0, **dict.fromkeys(SUMS, 0.0)})
        row["n"] += 1
        for c in SUMS:
            row[c] += getattr(o, c)
    return list(acc.values())


def controller_rows(
    trajectories: Sequence[Trajectory], decide: OfflineController, split_of: Mapping[str, str], **labels
) -> list[dict]:
    """Outcome sums of one controller, with ``labels`` as extra columns."""
    return [{**labels, **row} for row in outcome_sums(replay(trajectories, decide), split_of)]


def _comparison_classes(values: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group thresholds by which ``values`` they admit as high: (class of each threshold, one representative each)."""
    if values.size == 0:
        return np.zeros(len(thresholds), dtype=np.int64), np.array([0])
    high = values[None, :] >= thresholds[:, None]
    keys = high.astype(np.int64) @ (1 << np.arange(values.size, dtype=np.int64))
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


def evaluate_grid(
    trajectories: Sequence[Trajectory],
    predictions: Predictions,
    variants: Sequence[str],
    theta_p: Sequence[float],
    theta_u: Sequence[float],
    split_of: Mapping[str, str],
) -> pd.DataFrame:
    """Outcome sums for every variant × θ_P × θ_U (rows also keyed by split and dataset).

    Per trajectory, thresholds that compare the same way with its P̂ (resp. Û) values lead to the same
    decision, so the heuristic runs once per distinct pattern (at most (n+1)² per trajectory) and the
    outcome is spread over the grid.
    """
    tp, tu = np.asarray(theta_p, dtype=float), np.asarray(theta_u, dtype=float)
    frames = []
    for variant in variants:
        options = VARIANTS[variant]
        sums: dict[tuple[str, str], np.ndarray] = {}
        counts: dict[tuple[str, str], int] = {}
        for t in trajectories:
            signals = classified_signals(predictions, t, options)
            p_class, p_rep = _comparison_classes(np.array([p for p, _ in signals]), tp)
            u_class, u_rep = _comparison_classes(np.array([u for _, u in signals]), tu)
            values = np.empty((len(p_rep), len(u_rep), len(SUMS)))
            for a, i in enumerate(p_rep):
                for b, j in enumerate(u_rep):
                    o = outcome(t, replay_controller(predictions, Thresholds(tp[i], tu[j]), options)(t))
                    values[a, b] = [getattr(o, c) for c in SUMS]
            key = (split_of[t.qid], t.dataset)
            spread = values[p_class][:, u_class]  # (θ_P, θ_U, sums)
            sums[key] = sums[key] + spread if key in sums else spread
            counts[key] = counts.get(key, 0) + 1
        grid_p, grid_u = np.meshgrid(tp, tu, indexing="ij")
        for (split, dataset), total in sums.items():
            block = {
                "variant": variant,
                "theta_p": grid_p.ravel(),
                "theta_u": grid_u.ravel(),
                "split": split,
                "dataset": dataset,
                "n": counts[(split, dataset)],
            }
            block.update({c: total[:, :, k].ravel() for k, c in enumerate(SUMS)})
            frames.append(pd.DataFrame(block))
    return pd.concat(frames, ignore_index=True)


def baseline_rows(trajectories: Sequence[Trajectory], split_of: Mapping[str, str]) -> list[dict]:
    """Natural stopping and Cap@k for k = 1..the longest trajectory."""
    rows = controller_rows(trajectories, natural, split_of, controller="natural")
    for k in range(1, max(t.n_iterations for t in trajectories) + 1):
        rows += controller_rows(trajectories, cap(k), split_of, controller=f"cap@{k}")
    return rows


def add_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Means and the ratios against natural stopping, from summed rows."""
    out = df.copy()
    n = out["n"]
    out["mean_iterations"] = out["iterations"] / n
    out["natural_mean_iterations"] = out["natural_iterations"] / n
    out["iterations_change"] = relative_change(out["iterations"], out["natural_iterations"])
    out["mean_f1"] = out["f1"] / n
    out["natural_mean_f1"] = out["natural_f1"] / n
    out["f1_share"] = share(out["f1"], out["natural_f1"])
    out["mean_tokens"] = out["tokens"] / n
    out["tokens_saved"] = -relative_change(out["tokens"], out["natural_tokens"])
    return out


def aggregate(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Sum the outcome rows over everything but ``keys`` and add the metrics."""
    return add_metrics(df.groupby(list(keys), as_index=False, sort=False)[["n", *SUMS]].sum())


def select(points: pd.DataFrame, min_f1_share: float) -> pd.Series:
    """The operating point to keep among aggregated points (one row per θ pair, with metrics).

    Fewest mean iterations among those keeping ``min_f1_share`` of natural F1, ties to the higher F1
    and then the higher (more conservative) thresholds; if none qualifies, the highest F1 share.
    """
    if points.empty:
        raise ValueError("no points to select from")
    kept = points["f1_share"].fillna(1.0)
    ok = points[kept >= min_f1_share]
    if ok.empty:
        return points.assign(_s=kept).sort_values(["_s", "mean_iterations"], ascending=[False, True]).iloc[0].drop("_s")
    return ok.sort_values(
        ["mean_iterations", "mean_f1", "theta_p", "theta_u"], ascending=[True, False, False, False]
    ).iloc[0]


def choose_thresholds(
    grid: pd.DataFrame, min_f1_share: float, per_dataset: bool = False, split: str = "val"
) -> dict[str, Thresholds]:
    """Thresholds chosen on the ``split`` rows (validation) of one head × variant's grid.

    Returns ``{"*": θ}``; with ``per_dataset`` also one θ per dataset that has questions in ``split``
    ("*" then serves datasets without any).
    """
    val = grid[grid["split"] == split]
    if val.empty:
        raise ValueError(f"no {split} questions in the grid")
    best = select(aggregate(val, ["theta_p", "theta_u"]), min_f1_share)
    chosen = {"*": Thresholds(float(best["theta_p"]), float(best["theta_u"]))}
    if per_dataset:
        for dataset, part in val.groupby("dataset"):
            best = select(aggregate(part, ["theta_p", "theta_u"]), min_f1_share)
            chosen[dataset] = Thresholds(float(best["theta_p"]), float(best["theta_u"]))
    return chosen


def score_choice(grid: pd.DataFrame, chosen: Mapping[str, Thresholds], split: str) -> pd.Series:
    """Metrics on ``split`` of one head × variant's grid under chosen thresholds (per dataset, else "*")."""
    part = grid[grid["split"] == split]
    masks = []
    for dataset in part["dataset"].unique():
        th = chosen.get(dataset, chosen.get("*"))
        if th is None:
            raise ValueError(f"no thresholds chosen for dataset {dataset!r}")
        masks.append((part["dataset"] == dataset) & (part["theta_p"] == th.theta_p) & (part["theta_u"] == th.theta_u))
    rows = part[np.logical_or.reduce(masks)] if masks else part.iloc[:0]
    if rows.empty:
        raise ValueError(f"no {split} rows at the chosen thresholds {dict(chosen)}")
    return add_metrics(rows[["n", *SUMS]].sum().to_frame().T).iloc[0]


def cross_fit(grid: pd.DataFrame, min_f1_share: float, per_dataset: bool = False) -> pd.Series:
    """Metrics over all questions with each half scored under the other half's choice of thresholds.

    A steadier estimate than the test half alone (twice the questions), still never scoring a
    question with thresholds chosen on it.
    """
    on_test = score_choice(grid, choose_thresholds(grid, min_f1_share, per_dataset, "val"), "test")
    on_val = score_choice(grid, choose_thresholds(grid, min_f1_share, per_dataset, "test"), "val")
    return add_metrics((on_test[["n", *SUMS]] + on_val[["n", *SUMS]]).to_frame().T.astype(float)).iloc[0]


def beats_paper(iterations_change: float, f1_share: float) -> bool:
    """Fewer iterations than the paper's operating point at no less share of natural F1."""
    return iterations_change < PAPER_ITERATIONS_CHANGE and f1_share >= PAPER_F1_SHARE


def pareto_front(points: pd.DataFrame, x: str = "mean_iterations", y: str = "mean_f1") -> pd.DataFrame:
    """Non-dominated points: no other point has fewer-or-equal ``x`` and higher-or-equal ``y`` (one strictly)."""
    ordered = points.sort_values([x, y], ascending=[True, False])
    front, best_y = [], -math.inf
    for idx, row in ordered.iterrows():
        if row[y] > best_y:
            front.append(idx)
            best_y = row[y]
    return ordered.loc[front]
