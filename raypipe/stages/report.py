"""The report job: driver and entry point (``raypipe report``, ``python jobs/report.py``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from raypipe.analysis.blocks import Table, table_markdown
from raypipe.analysis.report import build_report
from raypipe.analysis.screenshot import ScreenshotError, assert_not_blank, screenshot
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging

DESCRIPTION = """Write RUN_DIR/report/: statistics, bootstrap intervals, plots and one HTML page (plus Markdown).

Works on any run directory: stages that have not run are listed as missing. Analysis options are the
``report`` section of the config (``--set report.epsilon=0.01``, ``--set report.bootstrap_samples=2000``).
"""


log = logging.getLogger(__name__)


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory to report on")
    parser.add_argument("--compare", type=Path, nargs="+", default=[], metavar="OTHER_RUN",
                        help="more run directories (e.g. the other agent) to put beside this run in the RQ-1 tables")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RUN_DIR/report)")
    parser.add_argument("--screenshot", action="store_true",
                        help="also render the page in headless Chromium to REPORT/screenshot.png and check it")
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)
    if not args.run_dir.is_dir():
        sys.exit(f"error: run directory {args.run_dir} does not exist")
    result = build_report(args.run_dir, config.report, args.out, args.compare)
    for section in result.sections:
        log.info("section %-14s %s", section.key, section.status)
    log.info("wrote %s and %s", result.html, result.markdown)
    rq1 = next((s for s in result.sections if s.key == "trajectories" and s.status == "ok"), None)
    table2 = next((b for b in rq1.blocks if isinstance(b, Table)), None) if rq1 else None
    if table2 is not None:
        print(table_markdown(table2))
    if args.screenshot:
        png = result.html.parent / "screenshot.png"
        try:
            screenshot(result.html, png)
            measures = assert_not_blank(png)
        except ScreenshotError as exc:
            sys.exit(f"error: {exc}")
        log.info("screenshot %s: %s", png, measures)
    if result.errors:
        sys.exit(f"error: sections failed: {', '.join(s.key for s in result.errors)} (see {result.html})")
