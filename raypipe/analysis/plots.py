"""Plots of the trajectory analysis (matplotlib, Agg backend, PNG files).

utility_histogram: the seed paper's Figure 3 (distribution of U_i); quality_curves: Figure 4 (mean P_i
by iteration for trajectories of positive / zero / negative net utility); oracle_savings: iterations an
oracle that stops at the first iteration reaching the final quality would save.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the backend is chosen before pyplot is imported
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from raypipe.analysis.stats import ALL, GROUPS

GROUP_COLORS = {"positive": "#2e7d32", "zero": "#757575", "negative": "#c62828"}
DPI = 110


def _save(fig: plt.Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return path


def _empty(path: Path, message: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11)
    return _save(fig, path)


def utility_histogram(iterations: pd.DataFrame, epsilon: float, path: Path) -> Path:
    """Share of iterations per utility bin (width 0.1, centred on 0), one panel per agent, bars per dataset."""
    u = iterations[(iterations["iteration"] >= 1) & iterations["utility"].notna()]
    if u.empty:
        return _empty(path, "no iteration after probe 0 to plot")
    edges = np.round(np.arange(-1.05, 1.0501, 0.1), 2)
    centres = (edges[:-1] + edges[1:]) / 2
    agents = sorted(u["agent"].unique())
    fig, axes = plt.subplots(len(agents), 1, figsize=(10, 3.6 * len(agents)), squeeze=False)
    for ax, agent in zip(axes[:, 0], agents):
        by_agent = u[u["agent"] == agent]
        datasets = sorted(by_agent["dataset"].unique())
        width = 0.09 / len(datasets)
        for k, dataset in enumerate(datasets):
            values = by_agent.loc[by_agent["dataset"] == dataset, "utility"].to_numpy(float)
            counts, _ = np.histogram(np.clip(values, -1, 1), bins=edges)
            zero = float((np.abs(values) < epsilon).mean())
            offset = (k - (len(datasets) - 1) / 2) * width
            ax.bar(
                centres + offset,
                100 * counts / len(values),
                width=width,
                label=f"{dataset} (n={len(values)}, |U| < ε: {zero:.0%})",
            )
        ax.set_xlim(-1.1, 1.1)
        ax.set_xticks(np.round(np.arange(-1, 1.01, 0.2), 1))
        ax.set_xlabel(r"utility $U_i = P_i - P_{i-1}$")
        ax.set_ylabel("share of iterations (%)")
        ax.set_title(f"{agent}: distribution of per-iteration utility (ε = {epsilon:g})")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def quality_curves(curves: pd.DataFrame, path: Path) -> Path:
    """Mean P_i by iteration per net-utility group; one row of panels per agent, one panel per dataset.

    ``curves`` is :func:`raypipe.analysis.stats.quality_by_iteration` output, per dataset and/or pooled.
    """
    if curves.empty:
        return _empty(path, "no probed trajectories to plot")
    agents = sorted(curves["agent"].unique())
    datasets = sorted(d for d in curves["dataset"].unique() if d != ALL)
    if ALL in set(curves["dataset"]):
        datasets.append(ALL)
    fig, axes = plt.subplots(
        len(agents),
        len(datasets),
        figsize=(3.4 * len(datasets) + 0.6, 3.2 * len(agents)),
        squeeze=False,
        sharey=True,
    )
    for r, agent in enumerate(agents):
        for c, dataset in enumerate(datasets):
            ax = axes[r, c]
            panel = curves[(curves["agent"] == agent) & (curves["dataset"] == dataset)]
            for group in GROUPS:
                line = panel[panel["net_group"] == group]
                if line.empty:
                    continue
                n0 = int(line["trajectories"].iloc[0])
                ax.plot(
                    line["iteration"], line["mean_p"], marker="o", color=GROUP_COLORS[group], label=f"{group} (n={n0})"
                )
            ax.set_title(f"{agent} · {dataset}", fontsize=10)
            ax.set_xlabel(r"iteration $i$")
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
            if not panel.empty:
                ax.set_xticks(range(int(panel["iteration"].max()) + 1))
            ax.legend(fontsize=7, frameon=False, title="net utility", title_fontsize=7)
        axes[r, 0].set_ylabel(r"mean $P_i$ (probe F1)")
    fig.tight_layout()
    return _save(fig, path)


def oracle_savings(summary: pd.DataFrame, path: Path) -> Path:
    """Left: mean iterations, natural vs an oracle stopping at the first iteration reaching the final
    quality. Right: how many iterations trajectories kept going after reaching it."""
    s = summary[summary["natural"]]
    if s.empty:
        return _empty(path, "no naturally terminated trajectories with probes")
    labels, natural, oracle = [], [], []
    multi_agent = s["agent"].nunique() > 1
    for (agent, dataset), g in s.groupby(["agent", "dataset"], sort=True):
        labels.append(f"{agent}\n{dataset}" if multi_agent else dataset)
        natural.append(g["last_iteration"].mean())
        oracle.append(g["oracle_iteration"].mean())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    x = np.arange(len(labels))
    left.bar(x - 0.2, natural, width=0.4, label="natural", color="#5c6bc0")
    left.bar(x + 0.2, oracle, width=0.4, label="oracle", color="#26a69a")
    for xi, nat, ora in zip(x, natural, oracle):
        if not nat:
            continue
        saved = 1 - ora / nat
        left.annotate(f"−{saved:.0%}", (xi + 0.2, ora), ha="center", va="bottom", fontsize=8)
    left.set_xticks(x, labels, fontsize=8)
    left.set_ylabel("mean iterations")
    left.set_title("iterations: natural stop vs oracle stop")
    left.legend(fontsize=8, frameon=False)
    left.grid(axis="y", alpha=0.3)
    extra = s["extra_iterations"].astype(int)
    values = np.arange(0, int(extra.max()) + 1)
    counts = extra.value_counts().reindex(values, fill_value=0)
    right.bar(values, 100 * counts.to_numpy() / len(extra), color="#8d6e63")
    right.set_xticks(values)
    right.set_xlabel("iterations after the final quality was first reached")
    right.set_ylabel("share of trajectories (%)")
    right.set_title(f"kept going after reaching final quality (n={len(extra)})")
    right.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)
