"""The stage's tables as CSV (every number) and Markdown (the paper's layout), under predictions/tables/."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from raypipe.core.config import TrainConfig
from raypipe.core.tables import markdown_table

TARGET_NAMES = {"p": "P_i (quality)", "u": "U_i (utility)"}


def _protocol(table: pd.DataFrame, cfg: TrainConfig) -> str:
    """The table's ``protocol`` column (raypipe.predict.splits.protocol_note), else cross-fitting."""
    if "protocol" in table and len(table):
        return str(table["protocol"].iloc[0])
    return f"protocol: cross-fitting within this run ({cfg.folds}-fold by question)"


def _cell(row: pd.Series) -> str:
    mark = "*" if row.get("significant") else ""
    return f"{row['pearson']:.3f}{mark} / {row['kendall']:.3f}"


def grid_markdown(results: pd.DataFrame, label: str, title: str, cfg: TrainConfig) -> str:
    """One block per target: rows = group (or source), columns = windows, cells = 'r / tau'."""
    test = "one-sided" if cfg.fisher_alternative == "greater" else "two-sided"
    lines = [
        f"## {title}",
        "",
        f"Cells: Pearson r / Kendall tau of held-out predictions ({_protocol(results, cfg)}); "
        f"* = r above w=1's by Fisher's z test ({test}, p < {cfg.significance}). "
        f"{int(cfg.confidence * 100)}% question-bootstrap intervals in the CSV.",
        "",
    ]
    windows = sorted(results["window"].unique())
    for target in ("p", "u"):
        block = results[results["target"] == target]
        if block.empty:
            continue
        n = int(block["n"].max())
        lines += [f"### {TARGET_NAMES[target]} (n = {n})", ""]
        rows = []
        for name in dict.fromkeys(block[label]):
            cells = [name]
            for w in windows:
                hit = block[(block[label] == name) & (block["window"] == w)]
                cells.append(_cell(hit.iloc[0]) if len(hit) else "")
            rows.append(cells)
        lines += [markdown_table([label, *(f"w={w}" for w in windows)], rows), ""]
    return "\n".join(lines)


def crossencoder_markdown(table: pd.DataFrame) -> str:
    columns = ["relation", "target", "n", "Pearson r [CI]", "Kendall tau [CI]", "train s / model", "models"]
    rows = [
        (
            r["relation"],
            r["target"],
            r["n"],
            f"{r['pearson']:.3f} [{r['pearson_lo']:.3f}, {r['pearson_hi']:.3f}]",
            f"{r['kendall']:.3f} [{r['kendall_lo']:.3f}, {r['kendall_hi']:.3f}]",
            r["train_seconds_per_model"],
            r["models"],
        )
        for _, r in table.iterrows()
    ]
    title = "## Cross-encoders (supervised signals), held out, against their own target"
    note = f"{table['protocol'].iloc[0]}.\n\n" if "protocol" in table and len(table) else ""
    return f"{title}\n\n{note}{markdown_table(columns, rows)}\n"


def write_tables(
    folder: Path, table3: pd.DataFrame, table4: pd.DataFrame, ce: pd.DataFrame, cfg: TrainConfig
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in (("table3_signal_groups", table3), ("table4_unsup_sources", table4), ("crossencoders", ce)):
        path = folder / f"{name}.csv"
        frame.to_csv(path, index=False, float_format="%.4f")
        written.append(path)
    docs = {
        "table3_signal_groups.md": grid_markdown(table3, "group", "Table 3: signal families x window", cfg),
        "table4_unsup_sources.md": grid_markdown(
            table4, "source", f"Table 4: unsupervised sources (group {cfg.ablation_group})", cfg
        ),
        "crossencoders.md": crossencoder_markdown(ce),
    }
    for name, text in docs.items():
        (folder / name).write_text(text)
        written.append(folder / name)
    return written


def plot_curves(curves: dict[str, pd.DataFrame], path: Path) -> Path:
    """Training loss per optimizer step of every cross-encoder, one panel per relation x target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({name.rsplit("_fold", 1)[0] for name in curves})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8), squeeze=False, sharey=False)
    for ax, panel in zip(axes[0], panels):
        for name, curve in sorted(curves.items()):
            if name.rsplit("_fold", 1)[0] == panel:
                ax.plot(curve["step"], curve["loss"], label=name.rsplit("_", 1)[-1], linewidth=1)
        ax.set_title(panel, fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("MSE (train)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
