"""``raypipe compare``: two hand-built run directories (tests.helpers.analysis_run), compared end to end.

The other run ("probe_off") is the hand-built run with the r1_searcher protocol, question A answered wrongly
in one iteration, question C taking three iterations and question D missing; question F failed (engine
error) in both, so A, B, C (hotpotqa) and E (musique) are compared.
"""

from __future__ import annotations

import os
import sys

import pandas as pd
import pytest
from scipy import stats

from raypipe import cli
from raypipe.analysis.paired import MCNEMAR, SIGNED_RANK_EXACT, adjust_pvalues
from raypipe.analysis.run_compare import CompareError, compare_runs, run_values, write_comparison
from raypipe.analysis.screenshot import assert_not_blank, find_browser, screenshot
from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir
from raypipe.core.schema import conform
from tests.helpers.analysis_run import build_run_dir

BASE_F1, OTHER_F1 = [1.0, 0.5, 0.5, 0.25], [0.0, 0.5, 0.5, 0.25]  # questions A, B, C, E
BASE_ITERATIONS, OTHER_ITERATIONS = [2, 3, 1, 0], [1, 3, 3, 0]


def _rewrite_trajectories(run: RunDir, edit) -> None:
    rows = {r["qid"]: r for r in run.read("trajectories").to_pylist()}
    edit(rows)
    for part in run.table_dir("trajectories").glob("*.parquet"):
        part.unlink()
    run.write_part("trajectories", conform(list(rows.values()), "trajectories"), "part-0")


def _probe_off(rows: dict) -> None:
    rows["A"].update(final_answer="y", final_f1=0.0, n_iterations=1)
    rows["C"].update(n_iterations=3)
    del rows["D"]


def _move_to_nq(rows: dict) -> None:
    for row in rows.values():
        row["dataset"] = "nq"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    base = build_run_dir(root / "base")
    other = build_run_dir(root / "probe_off", protocol="r1_searcher")
    _rewrite_trajectories(other, _probe_off)
    return base.path, other.path


def _row(result, dataset, metric):
    return result[(result["dataset"] == dataset) & (result["metric"] == metric)].iloc[0]


def test_paired_statistics_on_the_shared_questions(runs):
    comparison = compare_runs(runs, samples=200)
    assert comparison.labels == ["base", "probe_off"] and comparison.shared == 4
    questions = comparison.questions.set_index("run")
    assert questions.loc["base", ["questions", "not in every run", "failed in some run", "compared"]].tolist() == [
        6,
        1,
        1,
        4,
    ]
    assert questions.loc["probe_off", "not in every run"] == 0
    f1 = _row(comparison.result, "all", "final F1")
    assert (f1["n"], f1["baseline_mean"], f1["system_mean"], f1["mean_diff"]) == (4, 0.5625, 0.3125, -0.25)
    assert f1["t_p"] == pytest.approx(stats.ttest_rel(OTHER_F1, BASE_F1).pvalue)
    assert (f1["test"], f1["test_p"]) == (SIGNED_RANK_EXACT, 1.0)  # one question differs: either sign, 2 of 2
    iterations = _row(comparison.result, "all", "iterations")  # differences -1, 0, 2, 0: |T+ - 1.5| >= 0.5 always
    assert (iterations["test"], iterations["test_p"]) == (SIGNED_RANK_EXACT, 1.0) and pd.isna(iterations["t_p"])
    em = _row(comparison.result, "hotpotqa", "EM")  # computed: A's "y" misses the golden "x"
    assert (em["n"], em["baseline_mean"], em["system_mean"]) == (3, 1.0, pytest.approx(2 / 3))
    assert (em["test"], em["test_p"]) == (MCNEMAR, 1.0) and pd.isna(em["t_p"])  # one lost: min(1, 2 * 1/2)
    assert _row(comparison.result, "musique", "final F1")["n"] == 1
    assert set(comparison.result["dataset"]) == {"all", "hotpotqa", "musique"}
    assert "prompt_tokens" in comparison.skipped_metrics  # the hand-built runs record no costs
    assert "tokens_generated" in set(comparison.result["metric"])


def test_config_differences_are_the_settings_that_differ(runs):
    diff = compare_runs(runs, samples=50).config_diff
    assert diff.to_dict("records") == [
        {"setting": "agent.protocol", "base": "search_r1", "probe_off": "r1_searcher"},
        # each config.yaml holds the protocol's documents read (resolved when the config is built), as a probe run's
        {"setting": "retrieval.top_k", "base": "3", "probe_off": "5"},
    ]


def test_exact_match_is_computed_from_the_stored_answers(runs):
    values = run_values(RunDir(runs[1])).set_index("qid")
    assert values.loc["A", "em"] == 0.0 and values.loc["B", "em"] == 1.0
    assert pd.isna(values.loc["F", "em"]) and pd.isna(values.loc["F", "final_f1"])  # failed: not scored


def test_an_unscored_question_is_null_in_em_as_in_f1(runs, tmp_path):
    """A question without golden answers (asked live) has no F1; its EM is null too, not 0."""
    run = build_run_dir(tmp_path / "live")

    def unscored(rows: dict) -> None:
        rows["B"].update(golden_answers=[], final_f1=None)

    _rewrite_trajectories(run, unscored)
    values = run_values(run).set_index("qid")
    assert pd.isna(values.loc["B", "final_f1"]) and pd.isna(values.loc["B", "em"])
    assert values.loc["A", "em"] == 1.0
    result = compare_runs([runs[0], run.path], samples=20).result
    assert _row(result, "hotpotqa", "EM")["n"] == _row(result, "hotpotqa", "final F1")["n"] == 3  # A, C, D: B left out


def test_page_and_csv_copies(runs, tmp_path):
    html, md = write_comparison(compare_runs(runs, correction="bh", samples=50), tmp_path / "out")
    page = html.read_text()
    for text in (
        "Questions per run",
        "All datasets: against base",
        "hotpotqa: against base",
        "t p (BH)",
        "Configuration differences",
        "r1_searcher",
        "BH-corrected",
    ):
        assert text in page, text
    assert "| final F1 | probe_off | 4 |" in md.read_text()
    assert {p.name for p in (tmp_path / "out" / "tables").iterdir()} == {
        "paired.csv",
        "questions.csv",
        "config_diff.csv",
    }


def test_command_prints_the_table_and_writes_the_page(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    base, other = runs
    out = tmp_path / "page"
    cli.main(
        ["compare", str(other), "--baseline", str(base), "--out", str(out), "--set", "report.bootstrap_samples=50"]
    )
    printed = capsys.readouterr().out
    assert printed.startswith("4 questions compared against base")
    assert "| base | 6 | 1 | 1 | 4 | hotpotqa, musique |" in printed  # the questions left out, per run
    assert "| final F1 | probe_off | 4 | 0.562 | 0.312 | -0.250 [" in printed
    assert "settings that differ: agent.protocol" in printed
    assert (out / "index.html").exists()


def test_bad_input_is_one_clear_line(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    base, _ = runs
    with pytest.raises(SystemExit, match=r"^error: .*nope does not exist$"):
        cli.main(["compare", str(base), str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match=r"^error: .* is not a run directory: no trajectories/ table"):
        cli.main(["compare", str(base), str(tmp_path)])
    with pytest.raises(CompareError, match="at least two different run directories"):
        compare_runs([base, base])
    elsewhere = build_run_dir(tmp_path / "nq")
    _rewrite_trajectories(elsewhere, _move_to_nq)
    with pytest.raises(SystemExit, match=r"^error: the runs share no questions .* nq: 6 on nq; compare runs of"):
        cli.main(["compare", str(base), str(elsewhere.path)])


def _decisive(gain: bool):
    """Twelve hotpotqa questions: the baseline answers two exactly in three iterations; the other run answers
    all twelve exactly in one or two, with fewer tokens."""

    def edit(rows: dict) -> None:
        rows.clear()
        for i in range(12):
            exact = gain or i >= 10
            rows[f"Q{i}"] = {
                "qid": f"Q{i}",
                "dataset": "hotpotqa",
                "question": f"q{i}?",
                "golden_answers": ["x"],
                "final_answer": "x" if exact else "y",
                "final_f1": 1.0 if exact else 0.0,
                "n_iterations": 1 + i % 2 if gain else 3,
                "stop_reason": "answer",
                "error": None,
                "tokens_generated": 20 + i if gain else 40 + i,
                "probe_tokens": 3,
                "wall_s": 1.0,
                "transcript": "t",
            }

    return edit


def test_one_correction_family_over_metrics_and_datasets(tmp_path):
    """Issue 41: A against B made every (dataset, metric) a family of one test, so the Holm column was the
    raw p. Now every test of the comparison is one family. Hand-counted raw p-values: EM 10 gained, none
    lost: 2 * 0.5^10; F1 the same signs (10 of +1, two zeros); iterations and tokens 12 of 12 lower: 2 / 2^12;
    probe_tokens and wall_s equal: 1. Holm over the six: the smallest times 6."""
    base, other = build_run_dir(tmp_path / "base"), build_run_dir(tmp_path / "other")
    _rewrite_trajectories(base, _decisive(False))
    _rewrite_trajectories(other, _decisive(True))
    result = compare_runs([base.path, other.path], samples=50).result.set_index("metric")
    assert result["test_p"].to_dict() == pytest.approx(
        {
            "final F1": 2 / 2**10,
            "EM": 2 / 2**10,
            "iterations": 2 / 2**12,
            "tokens_generated": 2 / 2**12,
            "probe_tokens": 1.0,
            "wall_s": 1.0,
        }
    )
    assert set(result["family_size"]) == {6}
    assert result["test_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(result["test_p"].to_numpy()))
    assert result.loc["iterations", "test_p_adj"] == pytest.approx(6 * 2 / 2**12)
    assert (result["test_p_adj"] > result["test_p"]).sum() == 4  # the Holm column is no copy of the raw one
    assert result.loc["final F1", "t_p_adj"] == pytest.approx(min(1.0, 2 * result.loc["final F1", "t_p"]))  # F1, wall_s
    bh = compare_runs([base.path, other.path], correction="bh", samples=50).result.set_index("metric")
    assert bh["test_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(bh["test_p"].to_numpy(), "bh"))


def test_runs_scored_under_different_metric_rules_are_refused_unless_allowed(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    base, _ = runs
    other = build_run_dir(tmp_path / "r1rule")
    other.write_config(load_config("embedded", ["agent.metric=r1searcher", "name=handbuilt"]))
    message = r"different agent.metric rules \(base: hotpotqa, r1rule: r1searcher\)"
    with pytest.raises(CompareError, match=message + ".*--allow-mixed-metrics"):
        compare_runs([base, other.path], samples=20)
    with pytest.raises(SystemExit, match="^error: the runs were scored under " + message):
        cli.main(["compare", str(base), str(other.path), "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()
    allowed = compare_runs([base, other.path], samples=20, allow_mixed_metrics=True)
    assert allowed.mixed_metrics.startswith("WARNING: the runs were scored under different agent.metric rules")
    html, md = write_comparison(allowed, tmp_path / "page")
    assert "WARNING: the runs were scored under different agent.metric rules" in md.read_text()
    cli.main(
        [
            "compare",
            str(base),
            str(other.path),
            "--allow-mixed-metrics",
            "--out",
            str(tmp_path / "cli"),
            "--set",
            "report.bootstrap_samples=20",
        ]
    )
    assert "WARNING: the runs were scored under different agent.metric rules" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(
    find_browser() is None and not os.environ.get("CI"),
    reason="no chromium installed (apt-get install -y chromium); required when CI is set",
)
def test_the_page_opens_in_a_browser(runs, tmp_path):
    html, _ = write_comparison(compare_runs(runs, samples=50), tmp_path / "out")
    measures = assert_not_blank(screenshot(html, tmp_path / "shot.png", width=1280, height=1400))
    assert measures["colours"] > 200  # header, navigation and tables, not a plain page
