"""The report opens as a page in a real browser: headless Chromium screenshot, checked not blank.

Skipped only outside CI when no Chromium is installed; with CI set it must run (install chromium).
"""

import os

import pytest

from raypipe.analysis.screenshot import assert_not_blank, find_browser, screenshot
from raypipe.core.config import ReportConfig
from raypipe.stages.report import build_report
from tests.helpers.analysis_run import build_run_dir

if find_browser() is None and not os.environ.get("CI"):
    pytest.skip("no chromium installed (apt-get install -y chromium); required when CI is set", allow_module_level=True)


@pytest.mark.slow
def test_screenshot_of_the_report_is_not_blank(tmp_path):
    assert find_browser() is not None, "CI must install chromium: apt-get install -y chromium"
    run = build_run_dir(tmp_path / "run")
    result = build_report(run.path, ReportConfig(bootstrap_samples=100))
    png = screenshot(result.html, tmp_path / "shot.png", width=1280, height=1600)
    measures = assert_not_blank(png)
    assert (measures["width"], measures["height"]) == (1280, 1600)
    assert measures["colours"] > 200  # text, tables and plot colours, not a plain page
