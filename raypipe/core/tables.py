"""Markdown pipe tables: the one writer behind every table a stage writes as Markdown."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd


def markdown_table(columns: Sequence, rows: Iterable[Sequence]) -> str:
    """A pipe table: header, ``---`` rule, one line per row (no trailing newline).

    Cells are written with ``str``; ``|`` is escaped and a newline becomes a space, so no cell breaks the table.
    """
    lines = [_line(columns), "|" + "|".join("---" for _ in columns) + "|"]
    lines += [_line(row) for row in rows]
    return "\n".join(lines)


def frame_markdown(frame: pd.DataFrame) -> str:
    """:func:`markdown_table` of a frame's columns and rows (cells as they are: format them first)."""
    return markdown_table(list(frame.columns), frame.itertuples(index=False, name=None))


def _line(cells: Iterable) -> str:
    return "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"
