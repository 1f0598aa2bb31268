import os
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pyarrow as pa
import pytest

from raypipe.analysis import report
from raypipe.analysis.blocks import Table, Text
from raypipe.analysis.screenshot import assert_not_blank, blankness
from raypipe.core.config import ReportConfig
from raypipe.core.rundir import RunDir
from raypipe.stages.report import build_report
from tests.helpers.analysis_run import build_run_dir

ROOT = Path(__file__).resolve().parents[1]
FAST = ReportConfig(bootstrap_samples=200)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    run = build_run_dir(tmp_path_factory.mktemp("report") / "run")
    return build_report(run.path, FAST)


def test_page_has_the_tables_and_embedded_plots(built):
    html = built.html.read_text()
    for title in (
        "seed paper",
        "Distribution of per-iteration utility",
        "Trajectories by net utility",
        "Mean P_i by iteration",
        "oracle stop",
        "Stop reasons",
    ):
        assert title in html
    assert "0.750 [" in html  # hotpotqa final F1 with its interval
    assert "66.7% [" in html  # hotpotqa oracle iterations saved
    assert "55.6% [" in html  # hotpotqa zero-utility share
    assert html.count('src="data:image/png;base64,') == 3
    assert [s.status for s in built.sections if s.key in ("overview", "trajectories")] == ["ok", "ok"]
    assert not built.errors


def test_plots_exist_and_are_not_trivial(built):
    plots = sorted((built.html.parent / "plots").glob("*.png"))
    assert [p.name for p in plots] == ["oracle_savings.png", "quality_by_net_utility.png", "utility_histogram.png"]
    for png in plots:
        assert png.stat().st_size > 10_000
        measures = assert_not_blank(png)
        assert measures["width"] > 500


def test_markdown_and_csv_copies(built):
    md = built.markdown.read_text()
    assert "| search_r1 | hotpotqa | 4 | 0 | 0.375 [0.000, 0.750] | 0.750 [" in md
    assert "![" in md and "plots/utility_histogram.png" in md
    table2 = pd.read_csv(built.html.parent / "tables" / "table2.csv")
    assert table2.loc[table2["dataset"] == "hotpotqa", "final F1"].item() == pytest.approx(0.75)


def test_missing_stages_are_named_with_their_producers(built):
    status = {s.key: s.status for s in built.sections}
    assert {status[k] for k in ("features", "predictions", "stopping", "stoprag")} == {"missing"}
    html = built.html.read_text()
    assert "Not run yet" in html and "jobs/train.py" in html and "jobs/stoprag.py" in html


def test_empty_run_dir_still_gives_a_page(tmp_path):
    result = build_report(tmp_path, FAST)
    html = result.html.read_text()
    assert "jobs/probe.py" in html and "No config.yaml" in html
    assert {s.key: s.status for s in result.sections}["trajectories"] == "missing"
    assert not result.errors


def test_missing_run_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_report(tmp_path / "nope")


def test_generic_stage_folders_show_csv_markdown_png_and_parquet(tmp_path):
    run = RunDir(tmp_path / "run")  # no probe tables: this test is about the stage folders
    stopping = run.path / "stopping"
    (stopping / "tables").mkdir(parents=True)
    pd.DataFrame({"theta_P": [0.3, 0.5], "F1 kept": [0.976, 0.95]}).to_csv(stopping / "01_tradeoff.csv", index=False)
    (stopping / "02_summary.md").write_text(
        "## Operating points\n\nBest setting\nbelow.\n\n| setting | iterations |\n|---|---|\n| θ=0.3 | 2.86 |\n"
    )
    pd.DataFrame({"x": [123.25]}).to_csv(stopping / "02_summary.csv", index=False)  # the .md is shown instead
    pd.DataFrame({"w": [3], "pearson": [0.438]}).to_csv(stopping / "tables" / "table3.csv", index=False)
    (stopping / "tune").mkdir()  # other subfolders (Tune logs, checkpoints) are ignored
    pd.DataFrame({"trial": [1]}).to_csv(stopping / "tune" / "progress_marker.csv", index=False)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(stopping / "curve.png")
    plt.close(fig)
    run.write_part("features", pa.table({"qid": ["A", "B"], "nqc": [0.5, 1.5]}), "part-0")
    result = build_report(run.path, FAST)
    status = {s.key: s.status for s in result.sections}
    assert status["stopping"] == status["features"] == "ok"
    html = result.html.read_text()
    assert "01_tradeoff" in html and "0.976" in html and "2.86" in html
    assert "<h3>Operating points</h3>" in html and "<p>Best setting below.</p>" in html
    assert "123.25" not in html and "progress_marker" not in html
    assert "0.438" in html and "tables/table3.csv" in html
    assert html.count('src="data:image/png;base64,') == 1  # curve.png (no probe tables, so no RQ-1 plots)
    assert "features table: 2 rows" in html and "nqc" in html
    assert "### Operating points" in result.markdown.read_text()


def test_registered_sections_replace_stages_and_failures_are_contained(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "SECTIONS", dict(report.SECTIONS))
    run = RunDir(tmp_path / "run")
    (run.path / "stoprag").mkdir(parents=True)
    (run.path / "stoprag" / "q.csv").write_text("lam,f1\n0.5,0.4\n")

    def custom(ctx):
        frame = pd.read_csv(ctx.run.path / "stoprag" / "q.csv")
        return [Text("custom Stop-RAG section", "note"), Table("Q(λ)", frame)]

    def broken(ctx):
        raise RuntimeError("kaputt")

    report.register_section(report.Section("stoprag", "Stop-RAG", ("stoprag/q.csv",), custom, "jobs/stoprag.py"))
    report.register_section(report.Section("extra", "Broken section", (), broken))
    keys = [s.key for s in report.ordered_sections()]
    assert keys.index("stoprag") < keys.index("extra") and keys[-1] == "extra"
    result = build_report(run.path, FAST)
    html = result.html.read_text()
    assert "custom Stop-RAG section" in html and "Q(λ)" in html
    assert [s.key for s in result.errors] == ["extra"]
    assert "RuntimeError: kaputt" in html
    assert "Stages" in html and "jobs/probe.py" in html  # the other sections still render


@pytest.mark.slow
def test_report_job(tmp_path):
    run = build_run_dir(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "report.py"),
            str(run.path),
            "--set",
            "report.bootstrap_samples=100",
            "--set",
            "report.epsilon=0.01",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| search_r1 | hotpotqa | 4 |" in proc.stdout
    assert "100 resamples" in (run.path / "report" / "index.html").read_text()
    assert "ε = 0.01" in (run.path / "report" / "index.html").read_text()


def test_blankness_tells_blank_from_drawn(tmp_path):
    from PIL import Image

    Image.new("RGB", (200, 100), "white").save(tmp_path / "blank.png")
    assert blankness(tmp_path / "blank.png")["non_white"] == 0
    with pytest.raises(Exception, match="looks blank"):
        assert_not_blank(tmp_path / "blank.png")


def test_compared_runs_are_more_agents(tmp_path):
    search_r1 = build_run_dir(tmp_path / "s", protocol="search_r1")
    r1 = build_run_dir(tmp_path / "r", protocol="r1_searcher")
    result = build_report(search_r1.path, FAST, compare=[r1.path])
    md = result.markdown.read_text()
    assert "| search_r1 | hotpotqa | 4 |" in md and "| r1_searcher | hotpotqa | 4 |" in md
    assert "compared run" in md
    with pytest.raises(FileNotFoundError, match="no trajectories"):
        build_report(search_r1.path, FAST, compare=[tmp_path])


def test_run_without_probes_renders_without_errors(tmp_path):
    run = build_run_dir(tmp_path / "run")
    its = run.read("iterations")
    null = pa.nulls(its.num_rows, pa.float32())
    its = its.set_column(its.schema.get_field_index("probe_f1"), its.schema.field("probe_f1"), null)
    its = its.set_column(its.schema.get_field_index("utility"), its.schema.field("utility"), null)
    for part in (run.path / "iterations").glob("*.parquet"):
        part.unlink()
    run.write_part("iterations", its, "part-0")
    result = build_report(run.path, FAST)
    assert not result.errors
    assert "0.750 [" in result.html.read_text()  # the final answers' F1 is still there


def test_failures_are_announced(built):
    html = built.html.read_text()
    assert "1 of 6 trajectories ended in an infrastructure failure (engine_error: 1)" in html
    assert "First error: boom" in html
