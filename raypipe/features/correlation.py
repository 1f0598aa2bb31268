"""Pearson r of every signal with P_i (probe_f1) and U_i (utility), over the rows where both are present."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from raypipe.core.schema import FEATURE_COLUMNS
from raypipe.core.stats import finite_pairs, pearson

TARGETS = (("P", "probe_f1"), ("U", "utility"))


def correlation_table(features: pa.Table, signals: Sequence[str] = FEATURE_COLUMNS) -> list[dict]:
    """One row per signal: ``signal, r_P, n_P, r_U, n_U``; n counts the pairs where both values are finite,
    r is None with fewer than 3 pairs or a constant side."""
    rows = []
    for signal in signals:
        row: dict = {"signal": signal}
        x = features.column(signal).to_pylist()
        for name, column in TARGETS:
            y = features.column(column).to_pylist()
            r = pearson(x, y)
            row[f"r_{name}"] = None if math.isnan(r) else r
            row[f"n_{name}"] = len(finite_pairs(x, y)[0])
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
