"""Pearson r of every signal with P_i (probe_f1) and U_i (utility), over the rows where both are present."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from raypipe.core.schema import FEATURE_COLUMNS

TARGETS = (("P", "probe_f1"), ("U", "utility"))
MIN_PAIRS = 3


def pearson(x: Sequence[float | None], y: Sequence[float | None]) -> tuple[float | None, int]:
    """(r, n) over the pairs where both values are finite; r is None with < 3 pairs or a constant side."""
    a = np.array([np.nan if v is None else v for v in x], dtype=float)
    b = np.array([np.nan if v is None else v for v in y], dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    n = int(keep.sum())
    if n < MIN_PAIRS or a.std() == 0 or b.std() == 0:
        return None, n
    return float(np.corrcoef(a, b)[0, 1]), n


def correlation_table(features: pa.Table, signals: Sequence[str] = FEATURE_COLUMNS) -> list[dict]:
    """One row per signal: ``signal, r_P, n_P, r_U, n_U``."""
    rows = []
    for signal in signals:
        row: dict = {"signal": signal}
        x = features.column(signal).to_pylist()
        for name, column in TARGETS:
            row[f"r_{name}"], row[f"n_{name}"] = pearson(x, features.column(column).to_pylist())
        rows.append(row)
    return rows


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def format_table(rows: list[dict]) -> str:
    def r(value: float | None) -> str:
        return "   n/a" if value is None else f"{value:+.3f}"

    lines = [f"{'signal':<24} {'r(P_i)':>7} {'n':>6} {'r(U_i)':>7} {'n':>6}"]
    lines += [f"{x['signal']:<24} {r(x['r_P']):>7} {x['n_P']:>6} {r(x['r_U']):>7} {x['n_U']:>6}" for x in rows]
    return "\n".join(lines)
