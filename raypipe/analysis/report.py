"""The report's sections: the registry, the built-in renderers and the context they render from.

The report job (:mod:`raypipe.stages.report`) assembles ``RUN_DIR/report/``: ``index.html``
(self-contained: CSS inline, plots embedded), ``report.md`` (the same tables in Markdown), ``plots/*.png``
and ``tables/*.csv`` (the numbers behind the tables).

The report is a list of *sections*. A section is ``(key, title, requires, render)``: ``requires`` are
paths relative to RUN_DIR (a folder counts when it holds at least one file); when one is missing the
section says so (and which job produces it) instead of failing; otherwise ``render(ctx)`` returns blocks
(:class:`~raypipe.analysis.blocks.Table`, ``Figure``, ``Text``). A render that raises becomes an error
box in its section and the job exits non-zero after writing the page.

Conventions for later stages (features, predictions, stopping sweeps, Stop-RAG), so that their results
appear without touching this module:

1. Generic rendering, nothing to register. Write report-ready files at the top level of your stage
   folder ``RUN_DIR/<stage>/`` or in its ``tables/``, ``plots/`` or ``figures/`` subfolder (other
   subfolders are ignored, so checkpoints, Tune logs and training curves stay out of the page):
   ``*.md`` (``#`` headings, paragraphs and pipe tables are rendered), ``*.csv`` (a header row; shown
   as a table, first ``report.max_table_rows`` rows; skipped when a ``.md`` of the same name exists,
   which is taken as its formatted version), ``*.png`` (plots). Parquet parts at the top level are
   summarised (rows, columns, numeric ranges). Files appear in name order (top level first), so prefix
   them (``01_pearson.md``) to choose the order. Stages known here: ``features``, ``predictions``,
   ``tables`` (cross-stage tables such as ``RUN_DIR/tables/*.csv``), ``stopping``, ``stoprag``. The
   paired tests against natural stopping come this way: ``stopping/03_significance.md`` and
   ``stoprag/significance.md`` (one table per metric, :mod:`raypipe.analysis.policy_tests`), and the
   p-value columns of ``01_tradeoff.md`` and ``comparison.md``.
2. A custom section. Call :func:`register_section` (here, with the built-in sections below, or in a module
   imported before :func:`raypipe.stages.report.build_report` runs). A section with the key of a stage
   (e.g. ``"stopping"``) replaces that stage's generic rendering and keeps its place::

       from raypipe.analysis.report import Section, register_section
       from raypipe.analysis.blocks import Table, Figure

       def render(ctx):
           frame = pandas.read_csv(ctx.run.path / "stopping" / "tradeoff.csv")
           return [Table("Stopping trade-off", frame), Figure(ctx.run.path / "stopping" / "curve.png", "F1 vs cost")]

       register_section(Section("stopping", "Early stopping", ("stopping/tradeoff.csv",), render,
                                producer="jobs/sweep.py"))
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import yaml

from raypipe.analysis import plots
from raypipe.analysis.blocks import (
    Block,
    Figure,
    Table,
    Text,
    markdown_blocks,
)
from raypipe.analysis.bootstrap import headline_intervals
from raypipe.analysis.setup_section import render_setup
from raypipe.analysis.stats import (
    ALL,
    GROUPS,
    net_utility_groups,
    oracle_table,
    quality_by_iteration,
    stop_reasons,
    table2,
    trajectory_summary,
    usable_iterations,
    utility_distribution,
)
from raypipe.core.config import ReportConfig
from raypipe.core.rundir import RunDir, model_notes

log = logging.getLogger(__name__)


@dataclass
class RunMeta:
    """What the report says about the run, read leniently from RUN_DIR/config.yaml."""

    name: str = "unknown"
    agent: str = "unknown-agent"
    model: str = "unknown"
    backend: str = "unknown"
    config_found: bool = False

    @classmethod
    def read(cls, run: RunDir) -> RunMeta:
        path = run.path / "config.yaml"
        if not path.exists():
            return cls()
        tree = yaml.safe_load(path.read_text()) or {}
        get = lambda section, key, default: (tree.get(section) or {}).get(key, default)  # noqa: E731
        return cls(
            name=str(tree.get("name", "unknown")),
            agent=str(get("agent", "protocol", "unknown-agent")),
            model=str(get("engine", "model", "unknown")),
            backend=str(get("engine", "backend", "unknown")),
            config_found=True,
        )


@dataclass
class ReportContext:
    run: RunDir
    out: Path
    options: ReportConfig
    meta: RunMeta
    compare: list[RunDir] = field(default_factory=list)  # more runs (other agents) in the RQ-1 tables
    _frames: dict = field(default_factory=dict)

    def plot_path(self, name: str) -> Path:
        return self.out / "plots" / name

    def write_csv(self, name: str, frame: pd.DataFrame) -> Path:
        path = self.out / "tables" / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(path, index=False)
        return path

    def agent_labels(self) -> list[tuple[RunDir, str]]:
        """(run, agent label) for the run and the compared runs; the run name is added when protocols repeat."""
        runs = [self.run, *self.compare]
        metas = [self.meta if r is self.run else RunMeta.read(r) for r in runs]
        agents = [m.agent for m in metas]
        return [
            (r, m.agent if agents.count(m.agent) == 1 else f"{m.agent} ({m.name}: {r.path.name})")
            for r, m in zip(runs, metas)
        ]

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(iterations, trajectories) of every run as pandas with an ``agent`` column; read once."""
        if not self._frames:
            its, trajs = [], []
            for run, agent in self.agent_labels():
                its.append(run.read("iterations", ITERATION_COLUMNS).to_pandas().assign(agent=agent))
                trajs.append(run.read("trajectories", TRAJECTORY_COLUMNS).to_pandas().assign(agent=agent))
            self._frames["iterations"] = pd.concat(its, ignore_index=True)
            self._frames["trajectories"] = pd.concat(trajs, ignore_index=True)
        return self._frames["iterations"], self._frames["trajectories"]


ITERATION_COLUMNS = ["qid", "dataset", "iteration", "probe_f1", "utility"]
TRAJECTORY_COLUMNS = ["qid", "dataset", "final_f1", "n_iterations", "stop_reason", "error"]


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    requires: tuple[str, ...]
    render: Callable[[ReportContext], list[Block]]
    producer: str = ""  # the job that writes the required inputs, named in the 'missing' message
    order: float | None = None  # None: the place of the section it replaces, else after the others


SECTIONS: dict[str, Section] = {}


def register_section(section: Section) -> None:
    """Add a section, or replace the one with the same key (keeping its place unless ``order`` is set)."""
    old = SECTIONS.get(section.key)
    if section.order is None:
        order = old.order if old else max((s.order for s in SECTIONS.values()), default=0) + 10
        section = Section(section.key, section.title, section.requires, section.render, section.producer, order)
    SECTIONS[section.key] = section


def _present(run: RunDir, rel: str) -> bool:
    """A file exists, or a folder holds at least one file."""
    path = run.path / rel
    if path.is_dir():
        return any(p.is_file() for p in path.iterdir())
    return path.is_file()


def missing_requirements(section: Section, run: RunDir) -> list[str]:
    return [rel for rel in section.requires if not _present(run, rel)]


# ---------------------------------------------------------------- built-in sections


def _ci_cell(est: float, low: float, high: float, percent: bool = False) -> str:
    if pd.isna(est):
        return "–"
    fmt = (lambda x: f"{x:.1%}") if percent else (lambda x: f"{x:.3f}")
    return f"{fmt(est)} [{fmt(low)}, {fmt(high)}]" if pd.notna(low) else fmt(est)


def _with_ci(frame: pd.DataFrame, cis: pd.DataFrame, columns: dict[str, str], percent: tuple[str, ...] = ()):
    """Replace ``frame[col]`` by 'estimate [low, high]' cells from ``cis`` (figure name per column)."""
    out = frame.copy()
    lookup = cis.set_index(["agent", "dataset", "figure"])
    for col, figure in columns.items():
        out[col] = [
            _ci_cell(*lookup.loc[(a, d, figure), ["estimate", "low", "high"]], percent=col in percent)
            for a, d in zip(out["agent"], out["dataset"])
        ]
    return out


def _curve_table(pooled: pd.DataFrame) -> pd.DataFrame:
    """Pooled P_i curves as one row per (agent, group), one 'mean (n)' column per iteration."""
    cells = pooled.assign(
        cell=[f"{m:.3f} ({n})" for m, n in zip(pooled["mean_p"], pooled["trajectories"])],
        net_group=pd.Categorical(pooled["net_group"], categories=list(GROUPS), ordered=True),
    )
    wide = cells.pivot(index=["agent", "net_group"], columns="iteration", values="cell")
    wide = wide.dropna(how="all").reset_index()
    wide.columns = ["agent", "net utility"] + [f"i={c}" for c in wide.columns[2:]]
    wide["net utility"] = wide["net utility"].astype(str)
    return wide


def _failure_notes(summary: pd.DataFrame) -> list[Block]:
    """A warning when trajectories failed (:data:`~raypipe.analysis.stats.FAILED_STOPS`): they are left out of the
    figures."""
    failed = summary[summary["failed"]]
    if failed.empty:
        return []
    reasons = ", ".join(f"{r}: {n}" for r, n in failed["stop_reason"].value_counts().items())
    first_error = failed["error"].dropna().astype(str).head(1).tolist() if "error" in failed else []
    text = (
        f"{len(failed)} of {len(summary)} trajectories ended in an infrastructure failure ({reasons}) and are "
        "left out of every figure below."
    )
    if first_error:
        text += f" First error: {first_error[0][:300]}"
    return [Text(text, "missing" if len(failed) == len(summary) else "note")]


def render_trajectories(ctx: ReportContext) -> list[Block]:
    opt, eps = ctx.options, ctx.options.epsilon
    iterations, trajectories = ctx.frames()
    summary = trajectory_summary(iterations, trajectories, eps)
    cis = headline_intervals(summary, opt.bootstrap_samples, opt.bootstrap_seed, opt.confidence)
    t2, udist, groups = table2(summary), utility_distribution(summary), net_utility_groups(summary)
    oracle, reasons = oracle_table(summary), stop_reasons(summary)
    usable = usable_iterations(iterations, summary)
    curves = pd.concat(
        [quality_by_iteration(usable, summary, pooled=False), quality_by_iteration(usable, summary, pooled=True)],
        ignore_index=True,
    )
    for name, frame in {
        "trajectory_summary": summary,
        "table2": t2,
        "bootstrap": cis,
        "utility_distribution": udist,
        "net_utility_groups": groups,
        "quality_by_iteration": curves,
        "oracle": oracle,
        "stop_reasons": reasons,
    }.items():
        ctx.write_csv(name, frame)

    ci_note = (
        f"[low, high]: {opt.confidence:.0%} percentile bootstrap interval, {opt.bootstrap_samples} "
        f"resamples of the questions, seed {opt.bootstrap_seed}."
    )
    hist = plots.utility_histogram(usable, eps, ctx.plot_path("utility_histogram.png"))
    curve_plot = plots.quality_curves(curves, ctx.plot_path("quality_by_net_utility.png"))
    oracle_plot = plots.oracle_savings(summary, ctx.plot_path("oracle_savings.png"))
    curve_table = _curve_table(curves[curves["dataset"] == ALL])
    return [
        *_failure_notes(summary),
        Table(
            "Answer quality per dataset and agent (the seed paper's Table 2)",
            _with_ci(t2, cis, {c: c for c in ("P_0", "final F1", "ΔF1", "mean U_i", "mean iterations")}),
            note="questions: trajectories analysed; errors: trajectories that ended in an engine, retrieval or "
            "internal error or a query crash, left out of every figure of this section. P_0: F1 of the probe "
            "before any retrieval; final F1: the agent's own final answer; ΔF1 = final F1 − P_0; mean U_i over "
            f"iterations i ≥ 1. {ci_note}",
        ),
        Table(
            "Distribution of per-iteration utility U_i",
            _with_ci(udist, cis, {"zero": "zero-utility share"}, percent=("zero",)),
            percent=("positive", "negative"),
            note=f"zero: |U_i| < ε = {eps:g}; positive: U_i ≥ ε; negative: U_i ≤ −ε (iterations i ≥ 1).",
        ),
        Figure(
            hist,
            "Figure 3 analogue: share of iterations per utility bin (bins of 0.1; the middle bin holds |U_i| < 0.05).",
        ),
        Table(
            "Trajectories by net utility P_last − P_0",
            groups,
            percent=("positive share", "zero share", "negative share"),
            note=f"P_last: the probe at the trajectory's last iteration; zero: |net| < ε = {eps:g}.",
        ),
        Table(
            "Mean P_i by iteration and net-utility group (all datasets)",
            curve_table,
            note="Cell: mean probe F1 (number of trajectories still running at that iteration).",
        )
        if len(curve_table)
        else Text("No probed trajectory: no P_i curves.", "missing"),
        Figure(
            curve_plot,
            "Figure 4 analogue: mean P_i by iteration for trajectories of positive, zero and "
            "negative net utility (n at iteration 0; later points average the trajectories still "
            "running).",
        ),
        Table(
            "Final quality reached before natural termination; an oracle stop",
            _with_ci(oracle, cis, {"iter. saved": "oracle iterations saved"}, percent=("iter. saved",)),
            percent=("early share",),
            note="early: the first iteration with P_i ≥ P_last − ε comes before the last one; the agent then "
            "kept going 'extra iter.' more iterations (mean over those trajectories). The oracle stops at "
            "that first iteration and returns its probed answer (oracle P ≥ final P). Only naturally "
            f"terminated trajectories. {ci_note}",
        ),
        Figure(
            oracle_plot,
            "Mean iterations with natural stopping vs the oracle stop, and how long trajectories "
            "kept going after first reaching their final quality.",
        ),
        Table("Stop reasons", reasons),
    ]


def render_overview(ctx: ReportContext) -> list[Block]:
    meta = ctx.meta
    rows = [
        ("run directory", str(ctx.run.path.resolve())),
        ("run name", meta.name),
        ("agent protocol", meta.agent),
        ("model", meta.model),
        ("engine backend", meta.backend),
    ]
    rows += [("compared run", f"{r.path.resolve()} (agent {agent})") for r, agent in ctx.agent_labels()[1:]]
    blocks: list[Block] = [Text(f"{note}.", "note") for note in model_notes(r for r, _ in ctx.agent_labels())]
    if not meta.config_found:
        blocks.append(Text("No config.yaml in the run directory: the agent is labelled 'unknown-agent'.", "missing"))
    for name in ("trajectories", "iterations"):
        if ctx.run.has(name):
            rows.append(
                (f"{name} rows", str(pq.ParquetDataset(ctx.run.table_dir(name)).read(columns=["qid"]).num_rows))
            )
    blocks.insert(0, Table("Run", pd.DataFrame(rows, columns=["", "value"])))
    stages = []
    for section in ordered_sections():
        if section.key == "overview":
            continue
        missing = missing_requirements(section, ctx.run)
        status = "present" if not missing else "missing: " + ", ".join(missing)
        stages.append((section.title, ", ".join(section.requires), status, section.producer or "–"))
    blocks.append(Table("Stages", pd.DataFrame(stages, columns=["section", "needs", "status", "produced by"])))
    return blocks


REPORT_SUBFOLDERS = ("tables", "plots", "figures")  # shown besides a stage folder's top level


def stage_files(folder: Path) -> list[Path]:
    """The files of a stage folder the generic rendering shows, in order (see the module docstring)."""
    files = [p for p in sorted(folder.iterdir()) if p.is_file()]
    for sub in REPORT_SUBFOLDERS:
        if (folder / sub).is_dir():
            files += [p for p in sorted((folder / sub).iterdir()) if p.is_file()]
    files = [p for p in files if not p.name.startswith(".")]
    with_markdown = {p.with_suffix("") for p in files if p.suffix == ".md"}
    return [p for p in files if not (p.suffix == ".csv" and p.with_suffix("") in with_markdown)]


def render_stage_folder(stage: str) -> Callable[[ReportContext], list[Block]]:
    """The generic rendering of ``RUN_DIR/<stage>/``: Markdown and CSV tables, PNG plots, Parquet summaries."""

    def render(ctx: ReportContext) -> list[Block]:
        folder = ctx.run.path / stage
        blocks: list[Block] = []
        files = stage_files(folder)
        for path in files:
            name = path.relative_to(folder).as_posix()
            if path.suffix == ".csv":
                frame = pd.read_csv(path)
                limit = ctx.options.max_table_rows
                note = name + (f": first {limit} of {len(frame)} rows" if len(frame) > limit else "")
                blocks.append(Table(path.stem, frame.head(limit), note=note))
            elif path.suffix == ".md":
                content = markdown_blocks(path.read_text())
                if not (content and isinstance(content[0], Text) and content[0].kind == "h"):
                    content.insert(0, Text(path.stem, "h"))
                blocks += content
            elif path.suffix == ".png":
                blocks.append(Figure(path, name))
        parquet = [p for p in files if p.suffix == ".parquet" and p.parent == folder]
        if parquet:
            blocks.append(_parquet_summary(stage, parquet))
        if not blocks:
            blocks.append(Text(f"{folder} holds no *.csv, *.md, *.png or *.parquet files to show.", "missing"))
        return blocks

    return render


def _parquet_summary(stage: str, parts: list[Path]) -> Table:
    table = pq.ParquetDataset(parts).read()
    frame = table.to_pandas()
    numeric = frame.select_dtypes("number")
    rows = [
        (
            c,
            str(table.schema.field(c).type),
            frame[c].notna().sum(),
            numeric[c].mean() if c in numeric else float("nan"),
            numeric[c].min() if c in numeric else float("nan"),
            numeric[c].max() if c in numeric else float("nan"),
        )
        for c in frame.columns
    ]
    return Table(
        f"{stage} table: {table.num_rows} rows in {len(parts)} part(s)",
        pd.DataFrame(rows, columns=["column", "type", "non-null", "mean", "min", "max"]),
    )


STAGES = {  # stage folder -> (title, producing job)
    "features": ("Trajectory signals (features)", "jobs/features.py"),
    "predictions": ("Predictors of P_i and U_i", "jobs/train.py"),
    "stopping": ("Early stopping (offline sweeps)", "jobs/sweep.py"),
    "stoprag": ("Stop-RAG comparison", "jobs/stoprag.py"),
}

register_section(Section("overview", "Run and stages", (), render_overview, order=0))
register_section(
    Section(
        "setup",
        "Setup: how far this run is from the seed paper's",
        ("config.yaml",),
        render_setup,
        producer="jobs/probe.py",
        order=5,
    )
)
register_section(
    Section(
        "trajectories",
        "How answer quality evolves (RQ-1)",
        ("trajectories", "iterations"),
        render_trajectories,
        producer="jobs/probe.py",
        order=10,
    )
)
for _i, (_stage, (_title, _producer)) in enumerate(STAGES.items()):
    register_section(Section(_stage, _title, (_stage,), render_stage_folder(_stage), _producer, order=20 + 10 * _i))


def ordered_sections() -> list[Section]:
    return sorted(SECTIONS.values(), key=lambda s: s.order)
