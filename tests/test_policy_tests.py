"""Paired tests of stopping policies against natural stopping (raypipe.analysis.policy_tests): per-question
outcomes of the trade-off table's rows from a hand-made replay, the statistics against scipy, and the tables
of the sweep (Ray-free: the grid evaluated directly), Stop-RAG and the report that carry them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raypipe.analysis.paired import adjust_pvalues, signed_rank_p
from raypipe.analysis.policy_tests import policy_tests, pvalue_column, stoprag_pvalues, table_pvalues
from raypipe.core.config import ReportConfig, StoppingConfig
from raypipe.stopping.caps import cap, natural
from raypipe.stopping.heuristic import Thresholds
from raypipe.stopping.per_question import policy_labels, tradeoff_outcomes
from raypipe.stopping.replay import Trajectory
from raypipe.stopping.selection import BASELINE_SELECTION, FIXED_SELECTION

# qid: (dataset, P_0..P_n, tokens per iteration, final F1)
TRAJECTORIES = {
    "q1": ("hotpotqa", (0.0, 0.5, 1.0), (10, 10, 10), 1.0),
    "q2": ("hotpotqa", (0.2, 0.2, 0.2, 0.2), (5, 5, 5, 5), 0.2),
    "q3": ("hotpotqa", (1.0,), (4,), 1.0),
    "q4": ("hotpotqa", (0.0, 1.0, 0.5), (8, 8, 8), 0.5),
    "q5": ("musique", (0.1, 0.3, 0.6, 0.9), (6, 6, 6, 6), 0.9),
    "q6": ("musique", (0.5, 0.0), (7, 7), 0.0),
}
# (P̂, Û) per iteration; at θ = (0.5, 0.0): q1 stops at 1 (state 0), q4 rolls back from 2 to 1 (states 1, 3),
# q5 stops at 2 (states 2, 0); q2 and q6 never stop
PREDICTIONS = {
    "q1": {1: (0.6, 0.1), 2: (0.9, 0.3)},
    "q2": {1: (0.1, -0.1), 2: (0.1, -0.1), 3: (0.1, -0.1)},
    "q4": {1: (0.7, -0.2), 2: (0.2, -0.3)},
    "q5": {1: (0.2, 0.1), 2: (0.6, 0.3), 3: (0.9, 0.3)},
    "q6": {1: (0.0, -0.5)},
}
# (F1, iterations, tokens) per policy and question, worked out by hand from the replay's cost accounting
EXPECTED = {
    "natural": {
        "q1": (1.0, 2, 30),
        "q2": (0.2, 3, 20),
        "q3": (1.0, 0, 4),
        "q4": (0.5, 2, 24),
        "q5": (0.9, 3, 24),
        "q6": (0.0, 1, 14),
    },
    "cap@1": {
        "q1": (0.5, 1, 20),
        "q2": (0.2, 1, 10),
        "q3": (1.0, 0, 4),
        "q4": (1.0, 1, 16),
        "q5": (0.3, 1, 12),
        "q6": (0.0, 1, 14),
    },
    # rollback at 2 to answer 1: decided at the last iteration, so natural cost
    "heuristic[paper] g/w1 θ=(0.5, 0)": {
        "q1": (0.5, 1, 20),
        "q2": (0.2, 3, 20),
        "q3": (1.0, 0, 4),
        "q4": (1.0, 2, 24),
        "q5": (0.6, 2, 18),
        "q6": (0.0, 1, 14),
    },
    # musique's own θ never stops: q5 as natural stopping
    "heuristic[paper] g/w1 per_dataset": {
        "q1": (0.5, 1, 20),
        "q2": (0.2, 3, 20),
        "q3": (1.0, 0, 4),
        "q4": (1.0, 2, 24),
        "q5": (0.9, 3, 24),
        "q6": (0.0, 1, 14),
    },
}


def em(f1: float) -> float:
    """The hand-made trajectories' exact match: an answer is exact where its F1 is 1."""
    return float(f1 == 1.0)


def trajectories() -> list[Trajectory]:
    return [
        Trajectory(q, ds, p, tokens, final, sum(tokens), tuple(map(em, p)), em(final))
        for q, (ds, p, tokens, final) in TRAJECTORIES.items()
    ]


def expected(policy: str, qid: str, metric: str) -> float:
    f1, iterations, tokens = EXPECTED[policy][qid]
    return {"f1": f1, "em": em(f1), "iterations": iterations, "tokens": tokens}[metric]


def table() -> pd.DataFrame:
    head = {"feature_group": "g", "window": 1, "variant": "paper"}
    return pd.DataFrame(
        [
            {"controller": "natural", "selection": BASELINE_SELECTION},
            {"controller": "cap@1", "selection": BASELINE_SELECTION},
            {"controller": "heuristic[paper]", **head, "theta_p": 0.5, "theta_u": 0.0, "selection": FIXED_SELECTION},
            {"controller": "heuristic[paper]", **head, "selection": "per_dataset"},
        ]
    )


THRESHOLDS = {("g", 1, "paper", "per_dataset"): {"*": Thresholds(0.5, 0.0), "musique": Thresholds(2.0, 2.0)}}


def hand_outcomes() -> pd.DataFrame:
    split = dict.fromkeys(TRAJECTORIES, "test")
    return tradeoff_outcomes(table(), trajectories(), split, {("g", 1): PREDICTIONS}, THRESHOLDS)


def test_each_rows_policy_is_replayed_per_question():
    outcomes = hand_outcomes()
    assert policy_labels(table()) == list(EXPECTED)
    got = {(r.controller, r.qid): (r.f1, r.iterations, r.tokens) for r in outcomes.itertuples()}
    assert got == {(c, q): v for c, per_q in EXPECTED.items() for q, v in per_q.items()}
    assert (outcomes["em"] == outcomes["f1"].map(em)).all()  # the returned answer's EM, not the natural one's
    assert (outcomes["natural_em"] == outcomes["natural_f1"].map(em)).all()
    assert (outcomes["natural_f1"] == outcomes["qid"].map({q: v[0] for q, v in EXPECTED["natural"].items()})).all()


def test_only_the_test_questions_are_replayed_and_labels_stay_unique():
    split = {q: ("val" if q in ("q1", "q2") else "test") for q in TRAJECTORIES}
    outcomes = tradeoff_outcomes(table(), trajectories(), split, {("g", 1): PREDICTIONS}, THRESHOLDS)
    assert set(outcomes["qid"]) == {"q3", "q4", "q5", "q6"}
    twice = pd.concat([table(), table().iloc[[1]]], ignore_index=True)
    assert policy_labels(twice)[-1] == "cap@1 #2"
    with pytest.raises(ValueError, match="no predictions of the head g/w1"):
        tradeoff_outcomes(table(), trajectories(), split, {}, THRESHOLDS)


def test_statistics_against_natural_stopping_match_scipy_and_holm_by_hand():
    outcomes = hand_outcomes()
    result = policy_tests(outcomes, ReportConfig(bootstrap_samples=300))
    metrics = ("f1", "em", "iterations", "tokens")
    assert set(result["metric"]) == set(metrics) and set(result["baseline"]) == {"natural"}
    assert len(result) == 3 * 4  # three policies x four metrics
    for metric in metrics:
        family = result[result["metric"] == metric]
        base = [expected("natural", q, metric) for q in TRAJECTORIES]
        for row in family.itertuples():
            policy = [expected(row.system, q, metric) for q in TRAJECTORIES]
            assert row.n == 6
            assert row.mean_diff == pytest.approx(np.mean(np.subtract(policy, base)))
            if metric == "em":  # McNemar: the binomial tail of the discordant questions, counted here
                gained = sum(p > b for p, b in zip(policy, base))
                lost = sum(p < b for p, b in zip(policy, base))
                tail = sum(math.comb(gained + lost, k) for k in range(min(gained, lost) + 1)) / 2 ** (gained + lost)
                assert (row.test, row.test_p) == ("McNemar exact", pytest.approx(min(1.0, 2 * tail)))
            else:
                assert (row.test_p, row.test) == signed_rank_p(np.subtract(policy, base))
            if metric == "f1":
                assert row.t_p == pytest.approx(stats.ttest_rel(policy, base).pvalue)
            else:
                assert np.isnan(row.t_p)  # discrete: the exact test only
        raw = family["test_p"].to_numpy()
        m, order = len(raw), np.argsort(raw)
        holm = np.empty(m)
        holm[order] = np.minimum(np.maximum.accumulate(raw[order] * (m - np.arange(m))), 1.0)
        assert family["test_p_adj"].to_numpy() == pytest.approx(holm)
    cap_iterations = result[(result["system"] == "cap@1") & (result["metric"] == "iterations")].iloc[0]
    assert cap_iterations.mean_diff == pytest.approx(-1.0)  # 1, 2, 0, 1, 2, 0 fewer: 4 questions differ, all
    assert cap_iterations.test_p == pytest.approx(2 / 2**4)  # one way; only all-negative or all-positive as extreme
    bh = policy_tests(outcomes, ReportConfig(bootstrap_samples=300, correction="bh"))
    f1 = bh[bh["metric"] == "f1"]
    assert f1["test_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(f1["test_p"].to_numpy(), "bh"))
    assert set(bh["correction"]) == {"bh"}


def test_table_pvalues_leave_natural_empty_and_name_the_correction():
    outcomes = hand_outcomes()
    result = policy_tests(outcomes, ReportConfig(bootstrap_samples=300))
    labels = policy_labels(table())
    pvalues = table_pvalues(result, labels, "03_significance.md")
    assert len(pvalues.numbers) == len(pvalues.cells) == 4
    assert np.isnan(pvalues.numbers.loc[0, pvalue_column("f1", "t")]) and pvalues.cells.loc[0].tolist() == ["", "", ""]
    cap_test = result[(result["system"] == "cap@1") & (result["metric"] == "iterations")]["test_p_adj"].iloc[0]
    assert pvalues.numbers.loc[1, "iterations_test_p_adj"] == pytest.approx(cap_test)
    assert "iterations_t_p_adj" not in pvalues.numbers and "em_t_p_adj" not in pvalues.numbers  # discrete
    assert list(pvalues.cells.columns) == ["F1 p (t / signed-rank)", "EM p (McNemar)", "iterations p (signed-rank)"]
    assert pvalues.cells.loc[1, "F1 p (t / signed-rank)"].count(" / ") == 1
    assert pvalues.cells.loc[1, "iterations p (signed-rank)"].count(" / ") == 0
    assert "McNemar's exact test" in pvalues.note
    assert "Holm-corrected" in pvalues.note and "03_significance.md" in pvalues.note


def test_policies_against_each_other_when_asked():
    from raypipe.analysis.policy_tests import significance_markdown

    outcomes = hand_outcomes()
    plain = policy_tests(outcomes, ReportConfig(bootstrap_samples=300))
    pairs = policy_tests(outcomes, ReportConfig(bootstrap_samples=300, policy_pairs=True))
    assert len(pairs) == (3 + 3) * 4  # three against natural and three pairs, four metrics
    between = pairs[pairs["baseline"] != "natural"]
    assert set(zip(between["baseline"], between["system"])) == {
        ("cap@1", "heuristic[paper] g/w1 θ=(0.5, 0)"),
        ("cap@1", "heuristic[paper] g/w1 per_dataset"),
        ("heuristic[paper] g/w1 θ=(0.5, 0)", "heuristic[paper] g/w1 per_dataset"),
    }
    row = between[(between["baseline"] == "cap@1") & (between["metric"] == "f1")].iloc[0]
    a = [expected("cap@1", q, "f1") for q in TRAJECTORIES]
    b = [expected(row.system, q, "f1") for q in TRAJECTORIES]
    assert row.t_p == pytest.approx(stats.ttest_rel(b, a).pvalue)
    # six tests in each family now: the corrected p-values against natural stopping can only grow
    on_natural = pairs[pairs["baseline"] == "natural"].reset_index(drop=True)
    assert on_natural["test_p"].to_numpy() == pytest.approx(plain["test_p"].to_numpy())
    assert (on_natural["test_p_adj"].to_numpy() >= plain["test_p_adj"].to_numpy() - 1e-12).all()
    pvalues = table_pvalues(pairs, policy_labels(table()), "03_significance.md")
    assert pvalues.numbers.loc[1, "iterations_test_p_adj"] == pytest.approx(
        on_natural[(on_natural["system"] == "cap@1") & (on_natural["metric"] == "iterations")]["test_p_adj"].iloc[0]
    )
    markdown = significance_markdown(pairs, "t", "intro")
    assert "| baseline |" in markdown.replace("baseline mean", "") and "cap@1" in markdown


# ---------------------------------------------------------------- the sweep's and Stop-RAG's tables, the report


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A synthetic run swept without Tune: each head's grid evaluated directly, then steps 3-5 of run_sweep."""
    from raypipe.analysis.policy_tests import sweep_pvalues
    from raypipe.stopping.grid import evaluate_grid
    from raypipe.stopping.inputs import load_inputs
    from raypipe.stopping.outputs import DATA, STOPPING_DIR, write_outputs
    from raypipe.stopping.selection import choose
    from tests.test_sweep import write_synthetic_run

    run = write_synthetic_run(tmp_path_factory.mktemp("sweep") / "run")
    cfg = StoppingConfig(
        theta_p_grid=[0.0, 0.3, 0.6, 2.0],
        theta_u_grid=[-0.1, 0.2],
        quantile_points=1,
        variants=["paper", "delta_p"],
        refits=[],
    )
    inputs = load_inputs(run, cfg, None)
    grid = pd.concat(
        [
            evaluate_grid(
                inputs.trajectories, preds, cfg.variants, inputs.theta_p, inputs.theta_u, inputs.split_of
            ).assign(feature_group=group, window=window)
            for (group, window), preds in inputs.heads.items()
        ],
        ignore_index=True,
    )
    choices = choose(inputs, grid, cfg.min_f1_share)
    out = run.path / STOPPING_DIR
    (out / DATA).mkdir(parents=True)
    options = ReportConfig(bootstrap_samples=200)
    pvalues = sweep_pvalues(out, choices.table, inputs, inputs.heads, choices.thresholds, options)
    write_outputs(out, inputs, grid, choices, cfg.min_f1_share, pvalues)
    outcomes = tradeoff_outcomes(choices.table, inputs.trajectories, inputs.split_of, inputs.heads, choices.thresholds)
    return run, choices.table, outcomes


def test_per_question_outcomes_average_to_the_sweeps_table(swept):
    _, shown, outcomes = swept
    means = outcomes.groupby("controller", sort=False)[["f1", "iterations", "tokens"]].mean()
    for label, (_, row) in zip(policy_labels(shown), shown.iterrows()):
        assert means.loc[label, "f1"] == pytest.approx(row["mean_f1"])
        assert means.loc[label, "iterations"] == pytest.approx(row["mean_iterations"])
        assert means.loc[label, "tokens"] == pytest.approx(row["mean_tokens"])
        assert (outcomes["controller"] == label).sum() == row["questions"]


def test_the_sweeps_markdown_carries_pvalues_against_natural_stopping(swept):
    run, shown, _ = swept
    out = run.path / "stopping"
    md = (out / "01_tradeoff.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| controller"))
    assert "| F1 p (t / signed-rank) | EM p (McNemar) | iterations p (signed-rank) |" in header
    cells = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| cap@1 ")}
    assert set(cells) == {"cap@1"} and " / " in cells["cap@1"].split("|")[15]
    natural_row = next(line for line in md.splitlines() if line.startswith("| natural "))
    assert natural_row.split("|")[15].strip() == ""  # no test of natural against itself
    assert "EM (0/1): McNemar's exact test" in md and "Holm-corrected" in md
    csv = pd.read_csv(out / "01_tradeoff.csv")
    assert {"f1_t_p_adj", "f1_test_p_adj", "em_test_p_adj", "iterations_test_p_adj", "tokens_test_p_adj"} <= set(
        csv.columns
    )
    assert csv.loc[csv["controller"] == "natural", "f1_t_p_adj"].isna().all()
    assert csv.loc[csv["controller"] == "cap@1", "iterations_test_p_adj"].between(0, 1).all()
    significance = pd.read_csv(out / "03_significance.csv")
    assert set(significance["system"]) == set(policy_labels(shown)) - {"natural"}
    text = (out / "03_significance.md").read_text()
    assert text.startswith("# Early stopping: paired tests against natural stopping")
    assert all(f"## {m}\n" in text for m in ("F1", "EM", "iterations", "tokens")) and "Δ [CI]" in text


def test_the_report_shows_the_significance_tables(swept, tmp_path):
    from raypipe.stages.report import build_report

    run, _, _ = swept
    result = build_report(run.path, ReportConfig(bootstrap_samples=50), out=tmp_path / "report")
    stopping = next(s for s in result.sections if s.key == "stopping")
    assert stopping.status == "ok"
    html = result.html.read_text()
    assert "Early stopping: paired tests against natural stopping" in html
    assert "F1 p (t / signed-rank)" in html and "test p (Holm)" in html and "McNemar exact" in html


def test_stoprag_comparison_carries_pvalues(tmp_path):
    from raypipe.stoprag.comparison import comparison_rows, write_comparison

    test_t = trajectories()
    controllers = {"natural": (natural, ""), "cap@1": (cap(1), "")}
    rows, outcomes = comparison_rows(test_t, controllers)
    subset = [t for t in test_t if t.qid in ("q1", "q2", "q4")]  # LLM-Stop's first questions, with natural on them
    more, more_outcomes = comparison_rows(
        subset, {"natural (LLM-Stop questions)": (natural, ""), "llm_stop": (cap(1), "fake")}
    )
    rows, outcomes = rows + more, outcomes + more_outcomes
    pvalues = stoprag_pvalues(tmp_path, rows, outcomes, ReportConfig(bootstrap_samples=200))
    write_comparison(tmp_path, rows, outcomes, len(test_t), 3, "answers: the agent's probed answer", "", pvalues)
    result = pd.read_csv(tmp_path / "significance.csv")
    assert set(result["system"]) == {"cap@1", "llm_stop"}  # natural on LLM-Stop's questions is no policy
    llm = result[(result["system"] == "llm_stop") & (result["metric"] == "f1")].iloc[0]
    assert llm.n == 3  # paired on the questions it was run on
    assert llm.t_p == pytest.approx(stats.ttest_rel([0.5, 0.2, 1.0], [1.0, 0.2, 0.5]).pvalue)
    md = (tmp_path / "comparison.md").read_text()
    assert "| F1 p (t / signed-rank) | EM p (McNemar) | iterations p (signed-rank) | note |" in md
    assert "Holm-corrected" in md
    csv = pd.read_csv(tmp_path / "comparison.csv")
    assert csv.loc[csv["controller"] == "cap@1", "iterations_test_p_adj"].notna().all()
    assert csv.loc[csv["controller"].str.startswith("natural"), "f1_t_p_adj"].isna().all()
    assert (tmp_path / "significance.md").read_text().startswith("# Stop-RAG: paired tests against natural stopping")
