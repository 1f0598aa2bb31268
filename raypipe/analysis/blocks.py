"""Report content blocks (tables, figures, text) and their HTML and Markdown rendering."""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from raypipe.core.tables import markdown_table


@dataclass
class Table:
    """A table; ``frame`` cells may be numbers (formatted here) or ready strings."""

    title: str
    frame: pd.DataFrame
    note: str = ""
    percent: tuple[str, ...] = ()  # columns shown as percentages
    digits: int = 3
    name: str = ""  # file stem for the CSV copy under report/tables/ (empty: no copy)


@dataclass
class Figure:
    path: Path  # a PNG file
    caption: str = ""


@dataclass
class Text:
    text: str
    kind: str = "p"  # "p" paragraph, "h" heading, "note" (highlighted), "missing", "error", "pre" (preformatted)


Block = Table | Figure | Text


@dataclass
class RenderedSection:
    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    status: str = "ok"  # "ok", "missing", "error"


def format_cell(value, percent: bool = False, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "–"
        return f"{value:.{max(digits - 2, 1)}%}" if percent else f"{value:.{digits}f}"
    return str(value)


def formatted(table: Table) -> list[list[str]]:
    cols = list(table.frame.columns)
    return [
        [format_cell(v, c in table.percent, table.digits) for c, v in zip(cols, row)]
        for row in table.frame.itertuples(index=False, name=None)
    ]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


# ---------------------------------------------------------------- Markdown


def table_markdown(table: Table) -> str:
    lines = [f"**{table.title}**", ""] if table.title else []
    lines.append(markdown_table([str(c) for c in table.frame.columns], formatted(table)))
    if table.note:
        lines += ["", f"_{table.note}_"]
    return "\n".join(lines)


def block_markdown(block: Block, report_dir: Path) -> str:
    if isinstance(block, Table):
        return table_markdown(block)
    if isinstance(block, Figure):
        rel = _relative(block.path, report_dir)
        return f"![{block.caption}]({rel})" + (f"\n\n_{block.caption}_" if block.caption else "")
    if block.kind == "pre":
        return "```\n" + block.text + "\n```"
    if block.kind == "h":
        return f"### {block.text}"
    if block.kind in ("note", "missing", "error"):
        return f"> **{block.kind}:** {block.text}" if block.kind != "note" else f"> {block.text}"
    return block.text


def document_markdown(title: str, sections: list[RenderedSection], report_dir: Path) -> str:
    parts = [f"# {title}"]
    for section in sections:
        parts.append(f"## {section.title}")
        parts += [block_markdown(b, report_dir) for b in section.blocks]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------- HTML

CSS = """
:root { --fg:#1f2933; --muted:#616e7c; --line:#d9e2ec; --accent:#2f5d8a; --bg:#ffffff; --zebra:#f5f7fa; }
* { box-sizing: border-box; }
body { margin:0; font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color:var(--fg); background:var(--bg); }
header { background:var(--accent); color:#fff; padding:18px 32px; }
header h1 { margin:0; font-size:22px; font-weight:600; }
header p { margin:4px 0 0; opacity:.85; font-size:13px; }
nav { padding:10px 32px; border-bottom:1px solid var(--line); font-size:13px; background:#fbfcfd; }
nav a { color:var(--accent); margin-right:16px; text-decoration:none; white-space:nowrap; }
nav a.absent { color:var(--muted); }
nav a.absent::after { content:" (not run)"; font-size:11px; }
main { max-width:1400px; padding:8px 32px 48px; }
section { margin-top:28px; }
h2 { font-size:19px; border-bottom:2px solid var(--line); padding-bottom:4px; margin-bottom:12px; }
h3 { font-size:15px; margin:22px 0 6px; }
table { border-collapse:collapse; font-size:13px; margin:4px 0 4px; font-variant-numeric: tabular-nums; }
th, td { padding:4px 10px; border-bottom:1px solid var(--line); text-align:right; white-space:nowrap; }
th { background:#eef2f6; font-weight:600; }
th:first-child, td:first-child, th.text, td.text { text-align:left; }
tbody tr:nth-child(even) { background:var(--zebra); }
.tablewrap { overflow-x:auto; }
.note { color:var(--muted); font-size:12.5px; margin:2px 0 10px; }
.callout { background:#eef6fc; border-left:4px solid var(--accent); padding:8px 12px; margin:8px 0; }
.missing { background:#fff8e1; border-left:4px solid #f0b429; padding:8px 12px; margin:8px 0; }
.error { background:#fdecea; border-left:4px solid #c62828; padding:8px 12px; margin:8px 0; }
figure { margin:12px 0 20px; }
figure img { max-width:100%; border:1px solid var(--line); border-radius:4px; }
figcaption { color:var(--muted); font-size:12.5px; margin-top:4px; }
pre { background:#f5f7fa; padding:10px; overflow-x:auto; font-size:12px; }
"""


_NUMBER_LIKE = r"^[-−–\d.%\s\[\](),]*$"  # numbers, percentages, 'x [lo, hi]' and 'x (n)' cells


def _is_text_column(frame: pd.DataFrame, col) -> bool:
    """Left-align text; right-align numbers, also when they arrive as formatted strings."""
    if pd.api.types.is_numeric_dtype(frame[col]):
        return False
    return not frame[col].dropna().astype(str).str.match(_NUMBER_LIKE).all()


def table_html(table: Table) -> str:
    cols = list(table.frame.columns)
    text_cols = {c for c in cols if _is_text_column(table.frame, c)}
    cls = lambda c: ' class="text"' if c in text_cols else ""  # noqa: E731
    head = "".join(f"<th{cls(c)}>{html.escape(str(c))}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td{cls(c)}>{html.escape(v)}</td>" for c, v in zip(cols, row)) + "</tr>"
        for row in formatted(table)
    )
    out = f"<h3>{html.escape(table.title)}</h3>" if table.title else ""
    out += f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    if table.note:
        out += f'<p class="note">{html.escape(table.note)}</p>'
    return out


def figure_html(figure: Figure, report_dir: Path) -> str:
    data = base64.b64encode(Path(figure.path).read_bytes()).decode("ascii")
    rel = html.escape(_relative(figure.path, report_dir))
    caption = html.escape(figure.caption)
    return (
        f'<figure><a href="{rel}"><img alt="{caption}" src="data:image/png;base64,{data}"></a>'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def block_html(block: Block, report_dir: Path) -> str:
    if isinstance(block, Table):
        return table_html(block)
    if isinstance(block, Figure):
        return figure_html(block, report_dir)
    text = html.escape(block.text)
    if block.kind == "pre":
        return f"<pre>{text}</pre>"
    if block.kind == "h":
        return f"<h3>{text}</h3>"
    css = {"note": "callout", "missing": "missing", "error": "error"}.get(block.kind)
    return f'<div class="{css}">{text}</div>' if css else f"<p>{text}</p>"


def document_html(title: str, subtitle: str, sections: list[RenderedSection], report_dir: Path) -> str:
    nav = "".join(
        f'<a href="#{_slug(s.key)}"{" class=absent" if s.status == "missing" else ""}>{html.escape(s.title)}</a>'
        for s in sections
    )
    body = "".join(
        f'<section id="{_slug(s.key)}"><h2>{html.escape(s.title)}</h2>'
        + "".join(block_html(b, report_dir) for b in s.blocks)
        + "</section>"
        for s in sections
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)}</p></header>"
        f"<nav>{nav}</nav><main>{body}</main></body></html>\n"
    )


def _relative(path: Path, report_dir: Path) -> str:
    path = Path(path).resolve()
    try:
        return path.relative_to(Path(report_dir).resolve()).as_posix()
    except ValueError:
        return path.as_uri()


# ---------------------------------------------------------------- Markdown files found in stage folders


def markdown_blocks(text: str) -> list[Block]:
    """Read a Markdown file into blocks: '#' headings, pipe tables (as :class:`Table`), fenced code,
    and paragraphs (other Markdown is shown as written)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    para: list[str] = []

    def flush() -> None:
        if para:
            blocks.append(Text(" ".join(line.strip() for line in para)))
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if _is_row(line) and i + 1 < len(lines) and re.match(r"^\s*\|?\s*:?-{2,}", lines[i + 1]):
            flush()
            header = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and _is_row(lines[i]):
                rows.append((_cells(lines[i]) + [""] * len(header))[: len(header)])
                i += 1
            blocks.append(Table("", pd.DataFrame(rows, columns=header)))
            continue
        if line.strip().startswith("```"):
            flush()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
            blocks.append(Text("\n".join(lines[i + 1 : end]), "pre"))
            i = end + 1
            continue
        heading = re.match(r"^#{1,6}\s+(.*)", line)
        if heading:
            flush()
            blocks.append(Text(heading.group(1).strip(), "h"))
        elif line.strip():
            para.append(line)
        else:
            flush()
        i += 1
    flush()
    return blocks


def _is_row(line: str) -> bool:
    return line.strip().startswith("|") and line.strip().endswith("|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
