"""The report job: :func:`build_report` renders every registered section of a run directory
(:mod:`raypipe.analysis.report`) into one page, and the entry point (``raypipe report``,
``python jobs/report.py``)."""

from __future__ import annotations

import datetime as _dt
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from raypipe.analysis.blocks import RenderedSection, Table, Text, document_html, document_markdown, table_markdown
from raypipe.analysis.report import ReportContext, RunMeta, missing_requirements, ordered_sections
from raypipe.analysis.screenshot import ScreenshotError, assert_not_blank, screenshot
from raypipe.analysis.tracking import Headline, StageTracker, run_tracking
from raypipe.core.config import ReportConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.rundir import RunDir
from raypipe.runtime.stage_main import log_finished, print_model_note, tracking_or_exit

DESCRIPTION = """Write RUN_DIR/report/: statistics, bootstrap intervals, plots and one HTML page (plus Markdown).

Works on any run directory: stages that have not run are listed as missing. Analysis options are the
``report`` section of the config (``--set report.epsilon=0.01``, ``--set report.bootstrap_samples=2000``).
The sweep's and Stop-RAG's paired tests against natural stopping (stopping/03_significance.md,
stoprag/significance.md) appear in their sections. With tracking on (--set tracking.mlflow_uri=PATH_OR_URL,
or the run's own config.yaml) the page, its tables and plots are logged to MLflow.
"""


log = logging.getLogger(__name__)


@dataclass
class ReportResult:
    html: Path
    markdown: Path
    sections: list[RenderedSection]

    @property
    def errors(self) -> list[RenderedSection]:
        return [s for s in self.sections if s.status == "error"]

    def headline(self, more: tuple[Path, ...] = ()) -> Headline:
        """Sections by status; the page, its Markdown, tables and plots (and ``more``)."""
        counts = {
            f"sections_{status}": float(sum(s.status == status for s in self.sections))
            for status in ("ok", "missing", "error")
        }
        out = self.html.parent
        return Headline(counts, [self.html, self.markdown, out / "tables", out / "plots", *more])


def build_report(
    run_dir: str | Path,
    options: ReportConfig | None = None,
    out: str | Path | None = None,
    compare: list[str | Path] = (),
) -> ReportResult:
    """Render every registered section of ``run_dir`` into ``out`` (default RUN_DIR/report).

    ``compare``: further run directories (e.g. the other agent) whose trajectories join the RQ-1 tables
    and plots as more agents; the later-stage sections show ``run_dir`` only.
    """
    run = RunDir(run_dir)
    others = [RunDir(c) for c in compare]
    for r in (run, *others):
        if not r.path.is_dir():
            raise FileNotFoundError(f"run directory {r.path} does not exist")
    for r in others:
        if not (r.has("trajectories") and r.has("iterations")):
            raise FileNotFoundError(f"compared run {r.path} has no trajectories/iterations tables")
    ctx = ReportContext(
        run, Path(out) if out else run.path / "report", options or ReportConfig(), RunMeta.read(run), others
    )
    ctx.out.mkdir(parents=True, exist_ok=True)
    rendered = []
    for section in ordered_sections():
        missing = missing_requirements(section, run)
        if missing:
            paths = ", ".join(f"{run.path / m}" for m in missing)
            hint = f"; run {section.producer} on {run.path}" if section.producer else ""
            rendered.append(
                RenderedSection(
                    section.key, section.title, [Text(f"Not run yet: {paths} missing{hint}.", "missing")], "missing"
                )
            )
            continue
        try:
            blocks = section.render(ctx)
            rendered.append(RenderedSection(section.key, section.title, blocks))
        except Exception as exc:
            log.exception("section %s failed", section.key)
            rendered.append(
                RenderedSection(
                    section.key,
                    section.title,
                    [Text(f"This section failed: {type(exc).__name__}: {exc}", "error")],
                    "error",
                )
            )
    title = f"raypipe report: {ctx.meta.name}"
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    subtitle = f"{run.path.resolve()} · agent {ctx.meta.agent} · model {ctx.meta.model} · generated {stamp}"
    html_path, md_path = ctx.out / "index.html", ctx.out / "report.md"
    html_path.write_text(document_html(title, subtitle, rendered, ctx.out))
    md_path.write_text(document_markdown(title, rendered, ctx.out))
    return ReportResult(html_path, md_path, rendered)


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory to report on")
    parser.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        default=[],
        metavar="OTHER_RUN",
        help="more run directories (e.g. the other agent) to put beside this run in the RQ-1 tables",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RUN_DIR/report)")
    parser.add_argument(
        "--screenshot",
        action="store_true",
        help="also render the page in headless Chromium to REPORT/screenshot.png and check it",
    )
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)
    if not args.run_dir.is_dir():
        sys.exit(f"error: run directory {args.run_dir} does not exist")
    settings = tracking_or_exit(run_tracking, config.tracking, args.run_dir)  # the run's own when not set here
    tracker = tracking_or_exit(StageTracker.open, settings, args.run_dir, "report")
    result = build_report(args.run_dir, config.report, args.out, args.compare)
    for section in result.sections:
        log.info("section %-14s %s", section.key, section.status)
    log.info("wrote %s and %s", result.html, result.markdown)
    rq1 = next((s for s in result.sections if s.key == "trajectories" and s.status == "ok"), None)
    table2 = next((b for b in rq1.blocks if isinstance(b, Table)), None) if rq1 else None
    if table2 is not None:
        print(table_markdown(table2))
        print_model_note(RunDir(args.run_dir))
    if args.screenshot:
        png = result.html.parent / "screenshot.png"
        try:
            screenshot(result.html, png)
            measures = assert_not_blank(png)
        except ScreenshotError as exc:
            sys.exit(f"error: {exc}")
        log.info("screenshot %s: %s", png, measures)
    log_finished(tracker, config, result.headline((png,) if args.screenshot else ()))
    if result.errors:
        sys.exit(f"error: sections failed: {', '.join(s.key for s in result.errors)} (see {result.html})")
