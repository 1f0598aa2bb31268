"""Paired comparisons (raypipe.analysis.paired): the statistics checked against scipy on a hand-made case,
the corrections against hand-computed values (and statsmodels' multipletests where it is installed)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raypipe.analysis.paired import (
    CONSTANT_DIFFERENCE,
    NO_DIFFERENCE,
    TOO_FEW,
    adjust_pvalues,
    format_p,
    paired_comparisons,
    paired_test,
    summary_table,
)

BASELINE = [0.2, 0.5, 0.1, 0.9, 0.4, 0.6, 0.3, 0.8]
SYSTEM = [0.4, 0.5, 0.3, 1.0, 0.35, 0.9, 0.6, 0.7]  # one tie (question 2), one loss, mean gain 0.11875


def test_paired_test_matches_scipy_on_a_hand_made_case():
    test = paired_test(BASELINE, SYSTEM, samples=500, seed=3)
    assert test.n == 8
    assert test.baseline_mean == pytest.approx(3.8 / 8)
    assert test.system_mean == pytest.approx(4.75 / 8)
    assert test.mean_diff == pytest.approx(0.11875)
    assert test.t_p == pytest.approx(stats.ttest_rel(SYSTEM, BASELINE).pvalue)
    assert test.wilcoxon_p == pytest.approx(stats.wilcoxon(SYSTEM, BASELINE).pvalue)
    assert 0.01 < test.t_p < 0.1 and test.t_p != test.wilcoxon_p
    assert test.note == ""


def test_bootstrap_interval_is_the_percentile_interval_of_resampled_mean_differences():
    test = paired_test(BASELINE, SYSTEM, samples=500, confidence=0.9, seed=3)
    diff = np.subtract(SYSTEM, BASELINE)
    idx = np.random.default_rng(3).integers(0, len(diff), size=(500, len(diff)))
    low, high = np.quantile(diff[idx].mean(axis=1), [0.05, 0.95])
    assert (test.ci_low, test.ci_high) == pytest.approx((low, high))
    assert test.ci_low < test.mean_diff < test.ci_high
    assert paired_test(BASELINE, SYSTEM, samples=500, confidence=0.9, seed=3) == test  # seeded
    assert paired_test(BASELINE, SYSTEM, samples=500, confidence=0.9, seed=4).ci_low != test.ci_low


def test_degenerate_cases_are_named():
    same = paired_test(BASELINE, BASELINE)
    assert (same.t_p, same.wilcoxon_p, same.mean_diff, same.note) == (1.0, 1.0, 0.0, NO_DIFFERENCE)
    shifted = paired_test(BASELINE, np.add(BASELINE, 0.1))
    assert shifted.note == CONSTANT_DIFFERENCE and shifted.mean_diff == pytest.approx(0.1)
    one = paired_test([0.1], [0.3])
    assert one.n == 1 and np.isnan(one.t_p) and one.note == TOO_FEW
    assert paired_test([], []).n == 0
    with pytest.raises(ValueError, match="one length"):
        paired_test([1.0, 2.0], [1.0])


def test_holm_and_benjamini_hochberg_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04; Holm x4, x3, x2, x1 = .02 .03 .06 .04 -> running max .02 .03 .06 .06
    assert adjust_pvalues(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH x4/1, x4/2, x4/3, x4/4 = .02 .02 .04 .04 -> running min from the top: unchanged
    assert adjust_pvalues(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust_pvalues([0.5, 0.6], "holm") == pytest.approx([1.0, 1.0])  # capped at 1
    assert adjust_pvalues([0.5, 0.6], "bh") == pytest.approx([0.6, 0.6])
    nan_kept = adjust_pvalues([0.01, float("nan"), 0.04], "holm")  # NaN is not in the family: m = 2
    assert nan_kept[0] == pytest.approx(0.02) and np.isnan(nan_kept[1]) and nan_kept[2] == pytest.approx(0.04)
    with pytest.raises(ValueError, match="unknown correction"):
        adjust_pvalues(p, "bonferroni")


@pytest.mark.parametrize(("ours", "theirs"), [("holm", "holm"), ("bh", "fdr_bh")])
def test_corrections_agree_with_statsmodels(ours, theirs):
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    p = np.random.default_rng(0).uniform(0, 0.2, size=17)
    p[[3, 9]] = p[5]  # ties
    assert adjust_pvalues(p, ours) == pytest.approx(multitest.multipletests(p, method=theirs)[1])


def _frame():
    rows = []
    for dataset, shift in (("hotpotqa", 0.0), ("musique", 0.05)):
        for i, (b, s) in enumerate(zip(BASELINE, SYSTEM)):
            qid = f"{dataset}-{i}"
            rows.append({"qid": qid, "dataset": dataset, "policy": "natural", "f1": b, "iterations": 3})
            rows.append(
                {"qid": qid, "dataset": dataset, "policy": "heuristic", "f1": s + shift, "iterations": 2 + i % 2}
            )
            rows.append({"qid": qid, "dataset": dataset, "policy": "cap@1", "f1": b, "iterations": 1})
    frame = pd.DataFrame(rows)
    frame.loc[(frame["qid"] == "musique-0") & (frame["policy"] == "heuristic"), "f1"] = None
    return frame


def test_frame_api_compares_every_policy_per_group_and_corrects_per_family():
    result = paired_comparisons(_frame(), ["f1", "iterations"], "natural", system_column="policy",
                                by=["dataset"], samples=300)  # fmt: skip
    assert len(result) == 2 * 2 * 2  # datasets x metrics x policies
    assert list(result.columns[:5]) == ["dataset", "metric", "baseline", "system", "n"]
    row = result[(result["dataset"] == "hotpotqa") & (result["metric"] == "f1") & (result["system"] == "heuristic")]
    expected = paired_test(BASELINE, SYSTEM, samples=300)
    assert row["t_p"].item() == pytest.approx(expected.t_p) and row["ci_low"].item() == pytest.approx(expected.ci_low)
    musique = result[(result["dataset"] == "musique") & (result["metric"] == "f1") & (result["system"] == "heuristic")]
    assert musique["n"].item() == 7  # the null value leaves its question out of that pair
    cap = result[(result["metric"] == "f1") & (result["system"] == "cap@1")]
    assert set(cap["note"]) == {NO_DIFFERENCE} and set(cap["t_p"]) == {1.0}
    for _, family in result.groupby(["dataset", "metric"]):
        assert family["t_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(family["t_p"].to_numpy(), "holm"))
        assert family["wilcoxon_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(family["wilcoxon_p"], "holm"))
    assert set(result["correction"]) == {"holm"}
    bh = paired_comparisons(_frame(), ["f1"], "natural", system_column="policy", correction="bh", samples=100)
    assert len(bh) == 2 and set(bh["correction"]) == {"bh"} and (bh["t_p_adj"] <= bh["t_p"] * 2 + 1e-12).all()


def test_against_each_other_adds_the_pairs_of_systems_to_the_family():
    result = paired_comparisons(_frame(), ["f1"], "natural", system_column="policy", against_each_other=True,
                                samples=100)  # fmt: skip
    assert list(zip(result["baseline"], result["system"])) == [
        ("natural", "heuristic"),
        ("natural", "cap@1"),
        ("heuristic", "cap@1"),
    ]
    assert result["t_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(result["t_p"].to_numpy()))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="baseline 'oracle' has no values"):
        paired_comparisons(_frame(), ["f1"], "oracle", system_column="policy")
    with pytest.raises(ValueError, match=r"lack the columns \['em'\]"):
        paired_comparisons(_frame(), ["em"], "natural", system_column="policy")
    with pytest.raises(ValueError, match="repeat a question"):
        paired_comparisons(_frame(), ["f1"], "natural", system_column="policy", key="dataset")


def test_summary_table_formats_intervals_and_p_values():
    result = paired_comparisons(_frame(), ["f1"], "natural", system_column="policy", by=["dataset"], samples=100)
    table = summary_table(result)
    assert list(table.columns) == [
        "dataset",
        "metric",
        "baseline",
        "system",
        "n",
        "baseline mean",
        "system mean",
        "Δ [CI]",
        "t p",
        "t p (Holm)",
        "Wilcoxon p",
        "Wilcoxon p (Holm)",
        "note",
    ]
    assert table["Δ [CI]"].iloc[0].startswith("0.119 [")
    assert format_p(0.0004) == "<0.001" and format_p(0.0123) == "0.012" and format_p(float("nan")) == "–"
