"""Statistics over a run's ``iterations`` and ``trajectories`` tables (the seed paper's RQ-1).

Pure functions over pandas frames; every frame carries an ``agent`` column (the run's agent protocol)
so runs of several agents can be concatenated and compared. Definitions (the seed paper's public code
has no analysis module, so these are ours, stated here once):

- P_i is ``probe_f1`` of iteration i (0 = the probe before any retrieval); U_i is ``utility`` (i >= 1).
- A utility is *zero* when |U_i| < epsilon, *positive* when U_i >= epsilon, *negative* when U_i <= -epsilon.
- The *final probed quality* is P at the trajectory's last iteration; *net utility* = P_last - P_0,
  grouped positive / zero / negative with the same epsilon.
- ΔF1 = F1 of the agent's own final answer (``final_f1``) - P_0.
- The *oracle* stops at the first iteration k whose P_k >= P_last - epsilon: the first time the probed
  quality reached its final value. It saves last - k iterations and returns P_k (>= P_last).
  A trajectory *reached its final quality early* when k < last; it then kept going last - k iterations.
  Only naturally terminated trajectories count here (stop reasons in :data:`NATURAL_STOPS`): an engine
  error or an online controller did not let the agent decide when to stop.
- Trajectories that ended in an infrastructure failure (:data:`FAILED_STOPS`: engine, retrieval or internal error,
  query crash) say nothing about the agent: every figure leaves them out; Table 2 counts them in its ``errors``
  column and the stop-reason table lists them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from raypipe.core.schema import (
    STOP_ANSWER,
    STOP_CONTEXT,
    STOP_ENGINE_ERROR,
    STOP_INTERNAL_ERROR,
    STOP_MAX_TURNS,
    STOP_NO_ACTION,
    STOP_QUERY_CRASH,
    STOP_RETRIEVAL_ERROR,
)

NATURAL_STOPS = (STOP_ANSWER, STOP_MAX_TURNS, STOP_NO_ACTION, STOP_CONTEXT)
FAILED_STOPS = (STOP_ENGINE_ERROR, STOP_RETRIEVAL_ERROR, STOP_INTERNAL_ERROR, STOP_QUERY_CRASH)
ALL = "all"  # the dataset label of rows pooled over every dataset of an agent
GROUPS = ("positive", "zero", "negative")
KEYS = ["agent", "dataset", "qid"]


def sign_class(values: pd.Series | np.ndarray, epsilon: float) -> np.ndarray:
    """'positive' / 'zero' / 'negative' for each value (NaN stays None)."""
    values = np.asarray(values, dtype=float)
    out = np.full(values.shape, None, dtype=object)
    out[values >= epsilon] = "positive"
    out[values <= -epsilon] = "negative"
    out[np.abs(values) < epsilon] = "zero"
    return out


def _check_columns(frame: pd.DataFrame, name: str, columns: list[str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} frame lacks columns {missing}; has {list(frame.columns)}")


def trajectory_summary(iterations: pd.DataFrame, trajectories: pd.DataFrame, epsilon: float) -> pd.DataFrame:
    """One row per trajectory with every per-question figure the tables and intervals use.

    Trajectories without probe 0 (e.g. an engine error before it, or probing off) keep NaN probe figures.
    """
    _check_columns(iterations, "iterations", ["agent", "dataset", "qid", "iteration", "probe_f1", "utility"])
    _check_columns(trajectories, "trajectories", ["agent", "dataset", "qid", "final_f1", "n_iterations", "stop_reason"])
    its = iterations.dropna(subset=["probe_f1"]).sort_values(KEYS + ["iteration"])
    starts = its.groupby(KEYS, sort=False).head(1)
    with_probe0 = starts.loc[starts["iteration"] == 0, KEYS]  # no probe 0: no net utility, no ΔF1
    its = its.merge(with_probe0, on=KEYS)
    grouped = its.groupby(KEYS, sort=False)
    probes = grouped.head(1)[KEYS + ["probe_f1"]].rename(columns={"probe_f1": "p0"})
    last = grouped.tail(1)[KEYS + ["probe_f1", "iteration"]].rename(
        columns={"probe_f1": "p_last", "iteration": "last_iteration"}
    )
    probes = probes.merge(last, on=KEYS)
    # The oracle: the first iteration whose probe reaches the final one (the last row always does).
    reach = its.merge(last[KEYS + ["p_last"]], on=KEYS)
    reach = reach[reach["probe_f1"] >= reach["p_last"] - epsilon].groupby(KEYS, sort=False).head(1)
    probes = probes.merge(
        reach[KEYS + ["iteration", "probe_f1"]].rename(
            columns={"iteration": "oracle_iteration", "probe_f1": "oracle_p"}
        ),
        on=KEYS,
    )
    u = its.loc[(its["iteration"] >= 1) & its["utility"].notna(), KEYS + ["utility"]]
    u = u.assign(zero=u["utility"].abs() < epsilon, positive=u["utility"] >= epsilon, negative=u["utility"] <= -epsilon)
    u_stats = (
        u.groupby(KEYS)
        .agg(
            u_sum=("utility", "sum"),
            u_count=("utility", "size"),
            u_zero=("zero", "sum"),
            u_positive=("positive", "sum"),
            u_negative=("negative", "sum"),
        )
        .reset_index()
    )
    probes = probes.merge(u_stats, on=KEYS, how="left")

    kept = KEYS + ["final_f1", "n_iterations", "stop_reason"] + (["error"] if "error" in trajectories else [])
    summary = trajectories[kept].merge(probes, on=KEYS, how="left")
    summary["net_utility"] = summary["p_last"] - summary["p0"]
    summary["net_group"] = sign_class(summary["net_utility"], epsilon)
    summary["delta_f1"] = summary["final_f1"] - summary["p0"]
    summary["failed"] = summary["stop_reason"].isin(FAILED_STOPS)
    summary["natural"] = summary["stop_reason"].isin(NATURAL_STOPS) & summary["p0"].notna()
    summary.loc[summary["failed"], "net_group"] = None
    summary["extra_iterations"] = summary["last_iteration"] - summary["oracle_iteration"]
    summary["reached_early"] = summary["extra_iterations"] > 0
    for col in ("u_count", "u_zero", "u_positive", "u_negative"):
        summary[col] = summary[col].fillna(0).astype(int)
    summary["u_sum"] = summary["u_sum"].fillna(0.0).astype(float)
    return summary


def by_agent_dataset(summary: pd.DataFrame, include_failed: bool = False) -> list[tuple[str, str, pd.DataFrame]]:
    """(agent, dataset, rows) per dataset, then one pooled 'all' row per agent with several datasets.

    Failed trajectories are left out unless ``include_failed``; an agent/dataset with only failures
    still gets its (empty) rows, so the tables show it.
    """
    out = []
    for agent, by_agent in summary.groupby("agent", sort=True):
        datasets = sorted(by_agent["dataset"].unique())
        if not include_failed:
            by_agent = by_agent[~by_agent["failed"]]
        out += [(agent, d, by_agent[by_agent["dataset"] == d]) for d in datasets]
        if len(datasets) > 1:
            out.append((agent, ALL, by_agent))
    return out


def _ratio(num: pd.Series, den: pd.Series) -> float:
    total = float(den.sum())
    return float(num.sum()) / total if total else float("nan")


def table2(summary: pd.DataFrame) -> pd.DataFrame:
    """The seed paper's Table 2 per agent and dataset: final F1, ΔF1 over probe 0, mean U_i, mean iterations."""
    rows = []
    for agent, dataset, everything in by_agent_dataset(summary, include_failed=True):
        s = everything[~everything["failed"]]
        rows.append(
            {
                "agent": agent,
                "dataset": dataset,
                "questions": len(s),
                "errors": len(everything) - len(s),
                "P_0": s["p0"].mean(),
                "final F1": s["final_f1"].mean(),
                "ΔF1": s["delta_f1"].mean(),
                "mean U_i": _ratio(s["u_sum"], s["u_count"]),
                "mean iterations": s["n_iterations"].mean(),
            }
        )
    return pd.DataFrame(rows)


def utility_distribution(summary: pd.DataFrame) -> pd.DataFrame:
    """Share of iterations (i >= 1) with zero, positive and negative utility."""
    rows = []
    for agent, dataset, s in by_agent_dataset(summary):
        n = int(s["u_count"].sum())
        rows.append(
            {
                "agent": agent,
                "dataset": dataset,
                "iterations": n,
                "zero": _ratio(s["u_zero"], s["u_count"]),
                "positive": _ratio(s["u_positive"], s["u_count"]),
                "negative": _ratio(s["u_negative"], s["u_count"]),
                "mean U_i": _ratio(s["u_sum"], s["u_count"]),
            }
        )
    return pd.DataFrame(rows)


def net_utility_groups(summary: pd.DataFrame) -> pd.DataFrame:
    """Trajectories by net utility P_last - P_0: counts and shares per group."""
    rows = []
    for agent, dataset, s in by_agent_dataset(summary):
        s = s[s["net_group"].notna()]
        counts = s["net_group"].value_counts()
        row = {"agent": agent, "dataset": dataset, "trajectories": len(s)}
        for g in GROUPS:
            row[g] = int(counts.get(g, 0))
            row[f"{g} share"] = row[g] / len(s) if len(s) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def quality_by_iteration(iterations: pd.DataFrame, summary: pd.DataFrame, pooled: bool = True) -> pd.DataFrame:
    """Mean P_i by iteration for each net-utility group (long format).

    A trajectory contributes to iteration i only while it is still running (no carry-forward), so the
    ``trajectories`` column shrinks with i. With ``pooled`` the datasets of an agent are merged into 'all'.
    """
    groups = summary.loc[summary["net_group"].notna(), KEYS + ["net_group"]]
    merged = iterations.dropna(subset=["probe_f1"]).merge(groups, on=KEYS, how="inner")
    if pooled:
        merged = merged.assign(dataset=ALL)
    out = (
        merged.groupby(["agent", "dataset", "net_group", "iteration"])["probe_f1"]
        .agg(mean_p="mean", trajectories="count")
        .reset_index()
    )
    return out.sort_values(["agent", "dataset", "net_group", "iteration"], ignore_index=True)


def oracle_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Trajectories that reached their final probed quality before natural termination, and the oracle's savings."""
    rows = []
    for agent, dataset, s in by_agent_dataset(summary):
        s = s[s["natural"]]
        early = s[s["reached_early"]]
        natural_its = s["last_iteration"].sum()
        rows.append(
            {
                "agent": agent,
                "dataset": dataset,
                "trajectories": len(s),
                "early": len(early),
                "early share": len(early) / len(s) if len(s) else float("nan"),
                "extra iter. (early)": early["extra_iterations"].mean(),
                "natural iter.": s["last_iteration"].mean(),
                "oracle iter.": s["oracle_iteration"].mean(),
                "iter. saved": s["extra_iterations"].sum() / natural_its if natural_its else float("nan"),
                "final P": s["p_last"].mean(),
                "oracle P": s["oracle_p"].mean(),
            }
        )
    return pd.DataFrame(rows)


def stop_reasons(summary: pd.DataFrame) -> pd.DataFrame:
    """Trajectories per stop reason (so errors and controller stops are visible, not silently dropped)."""
    counts = summary.groupby(["agent", "dataset", "stop_reason"]).size().rename("trajectories").reset_index()
    return counts.sort_values(["agent", "dataset", "trajectories"], ascending=[True, True, False], ignore_index=True)


def usable_iterations(iterations: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The iteration rows of trajectories that did not fail (what the plots of U_i and P_i show)."""
    ok = summary.loc[~summary["failed"], KEYS]
    return iterations.merge(ok, on=KEYS, how="inner")
