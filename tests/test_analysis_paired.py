"""Paired comparisons (raypipe.analysis.paired): the exact tests against distributions counted by hand, the t
test against scipy on a hand-made case, the corrections against hand-computed values (and statsmodels'
multipletests where it is installed)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raypipe.analysis.paired import (
    CONSTANT_DIFFERENCE,
    MCNEMAR,
    NO_DIFFERENCE,
    SIGNED_RANK_EXACT,
    TOO_FEW,
    adjust_pvalues,
    format_p,
    paired_comparisons,
    paired_test,
    signed_rank_p,
    summary_table,
)

BASELINE = [0.2, 0.5, 0.1, 0.9, 0.4, 0.6, 0.3, 0.8]
SYSTEM = [0.4, 0.5, 0.3, 1.0, 0.35, 0.9, 0.6, 0.7]  # one tie (question 2), one loss, mean gain 0.11875
FOUR_GAINED = ([0] * 30, [1] * 4 + [0] * 26)  # 30 questions, 4 improved, none worse


def test_paired_test_on_a_hand_made_case():
    """Differences 0.2, 0, 0.2, 0.1, -0.05, 0.3, 0.3, -0.1: the zero dropped, |d| ranked 0.05 -> 1, 0.1 and
    0.1 -> 2.5 (1.0 - 0.9 and 0.8 - 0.7 tie), 0.2 and 0.2 -> 4.5, 0.3 and 0.3 -> 6.5; T+ = 28 - 1 - 2.5 =
    24.5 of 28. |T+ - 14| >= 10.5 needs T+ >= 24.5 or <= 3.5: the 2^7 sign assignments with the negative
    ranks summing to <= 3.5 are {}, {1}, {2.5}, {2.5'}, {1, 2.5}, {1, 2.5'}: 6, twice (both tails): p = 12/128."""
    test = paired_test(BASELINE, SYSTEM, samples=500, seed=3)
    assert test.n == 8
    assert test.baseline_mean == pytest.approx(3.8 / 8)
    assert test.system_mean == pytest.approx(4.75 / 8)
    assert test.mean_diff == pytest.approx(0.11875)
    assert test.t_p == pytest.approx(stats.ttest_rel(SYSTEM, BASELINE).pvalue)
    assert (test.test, test.test_p) == (SIGNED_RANK_EXACT, pytest.approx(12 / 128))
    assert 0.01 < test.t_p < 0.1 and test.note == ""


def test_mcnemar_exact_for_a_binary_metric():
    """4 questions gained, none lost: p = 2 * 0.5^4 = 0.125, where scipy's Wilcoxon (normal approximation
    after dropping the 26 zeros) and the t test claim < 0.05. 5 gained, 1 lost: 2 * (1 + 6) / 64."""
    test = paired_test(*FOUR_GAINED, kind="binary")
    assert (test.test, test.test_p) == (MCNEMAR, 0.125)
    assert np.isnan(test.t_p) and test.mean_diff == pytest.approx(4 / 30)
    assert stats.wilcoxon(FOUR_GAINED[1], FOUR_GAINED[0]).pvalue < 0.05  # what the code reported before
    five_one = paired_test([0] * 5 + [1] + [1] * 4, [1] * 5 + [0] + [1] * 4, kind="binary")
    assert five_one.test_p == pytest.approx(14 / 64)
    assert paired_test([1, 0, 1], [1, 0, 1], kind="binary").test_p == 1.0
    assert paired_test([1, 0], [0, 1], kind="binary").test_p == 1.0  # one each way: min(1, 2 * 3/4)


def test_signed_rank_exact_for_counts_by_hand():
    """Counted over every sign assignment by hand.
    4 of 30 gain 1 iteration: the four ties rank 2.5; only all-positive or all-negative is as extreme: 2/16.
    Differences 1, -2, 3, 4: T+ = 8 of 10; T+ in {0, 1, 2, 8, 9, 10}: 6 of the 16 subsets of {1, 2, 3, 4}.
    Differences 0, 1, 1, -2, 3: ranks 1.5, 1.5, 3, 4, T+ = 7; |T+ - 5| >= 2 in 10 of 16 assignments."""
    test = paired_test(*FOUR_GAINED, kind="count")
    assert (test.test, test.test_p) == (SIGNED_RANK_EXACT, pytest.approx(0.125)) and np.isnan(test.t_p)
    assert signed_rank_p(np.array([1, -2, 3, 4])) == (pytest.approx(6 / 16), SIGNED_RANK_EXACT)
    assert signed_rank_p(np.array([0, 1, 1, -2, 3])) == (pytest.approx(10 / 16), SIGNED_RANK_EXACT)
    assert signed_rank_p(np.array([-1, -2, -3])) == (pytest.approx(2 / 8), SIGNED_RANK_EXACT)
    no_ties = np.array([0.3, -1.2, 2.5, 0.7, 1.9, -0.4, 3.1, 0.05, 1.4])  # where scipy's own is exact
    assert signed_rank_p(no_ties)[0] == pytest.approx(stats.wilcoxon(no_ties, method="exact").pvalue)


def test_signed_rank_by_permutation_beyond_the_exact_limit():
    """Beyond ``exact_max`` nonzero differences: seeded random sign flips, named so; close to the exact 6/16."""
    p, name = signed_rank_p(np.array([1, -2, 3, 4]), seed=5, exact_max=3)
    assert name == "signed-rank permutation (20000 sign flips, seed 5)"
    assert p == pytest.approx(6 / 16, abs=0.015)
    assert signed_rank_p(np.array([1, -2, 3, 4]), seed=5, exact_max=3)[0] == p  # seeded
    assert signed_rank_p(np.array([1, -2, 3, 4]), seed=6, exact_max=3)[0] != p
    extreme, _ = signed_rank_p(np.arange(1.0, 31.0), exact_max=10, permutations=999)
    assert extreme == pytest.approx(1 / 1000)  # no flip is as extreme: (1 + 0) / (1 + 999)


def test_metric_kinds_refuse_values_of_another_kind():
    with pytest.raises(ValueError, match="binary metric holds only 0 and 1"):
        paired_test([0.0, 1.0], [0.5, 1.0], kind="binary")
    with pytest.raises(ValueError, match="count metric holds only integers"):
        paired_test([1.0, 2.0], [1.5, 2.0], kind="count")
    with pytest.raises(ValueError, match="unknown metric kind"):
        paired_test([1.0, 2.0], [1.0, 2.0], kind="ordinal")


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
    assert (same.t_p, same.test_p, same.mean_diff, same.note) == (1.0, 1.0, 0.0, NO_DIFFERENCE)
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
    result = paired_comparisons(
        _frame(),
        {"f1": "continuous", "iterations": "count"},
        "natural",
        system_column="policy",
        by=["dataset"],
        samples=300,
    )
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
        assert family["t_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(family["t_p"].to_numpy()), nan_ok=True)
        assert family["test_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(family["test_p"], "holm"))
        assert set(family["family_size"]) == {2}
    assert set(result["correction"]) == {"holm"}
    iterations = result[result["metric"] == "iterations"]
    assert set(iterations["test"]) == {SIGNED_RANK_EXACT} and iterations["t_p"].isna().all()
    bh = paired_comparisons(
        _frame(), {"f1": "continuous"}, "natural", system_column="policy", correction="bh", samples=100
    )
    assert len(bh) == 2 and set(bh["correction"]) == {"bh"} and (bh["t_p_adj"] <= bh["t_p"] * 2 + 1e-12).all()


def test_against_each_other_adds_the_pairs_of_systems_to_the_family():
    result = paired_comparisons(
        _frame(), {"f1": "continuous"}, "natural", system_column="policy", against_each_other=True, samples=100
    )
    assert list(zip(result["baseline"], result["system"])) == [
        ("natural", "heuristic"),
        ("natural", "cap@1"),
        ("heuristic", "cap@1"),
    ]
    assert result["t_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(result["t_p"].to_numpy()))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="baseline 'oracle' has no values"):
        paired_comparisons(_frame(), {"f1": "continuous"}, "oracle", system_column="policy")
    with pytest.raises(ValueError, match=r"lack the columns \['em'\]"):
        paired_comparisons(_frame(), {"em": "binary"}, "natural", system_column="policy")
    with pytest.raises(ValueError, match="repeat a question"):
        paired_comparisons(_frame(), {"f1": "continuous"}, "natural", system_column="policy", key="dataset")
    with pytest.raises(ValueError, match="^f1: a binary metric holds only 0 and 1"):
        paired_comparisons(_frame(), {"f1": "binary"}, "natural", system_column="policy")


def test_one_family_over_every_test_of_the_call():
    """``family=()``: every group and metric corrected together (``raypipe compare``'s families), so one
    system against a baseline is corrected across metrics x datasets, not each test alone."""
    frame = _frame()[lambda f: f["policy"] != "cap@1"]
    kinds = {"f1": "continuous", "iterations": "count"}
    per_metric = paired_comparisons(frame, kinds, "natural", system_column="policy", by=["dataset"], samples=50)
    assert (per_metric["test_p_adj"] == per_metric["test_p"]).all()  # families of one test: Holm = raw
    together = paired_comparisons(
        frame, kinds, "natural", system_column="policy", by=["dataset"], family=(), samples=50
    )
    assert len(together) == 4 and set(together["family_size"]) == {4}
    assert together["test_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(together["test_p"].to_numpy()))
    assert (together["test_p_adj"] > together["test_p"]).any()
    assert together["t_p_adj"].to_numpy() == pytest.approx(adjust_pvalues(together["t_p"].to_numpy()), nan_ok=True)


def test_summary_table_formats_intervals_and_p_values():
    result = paired_comparisons(
        _frame(), {"f1": "continuous"}, "natural", system_column="policy", by=["dataset"], samples=100
    )
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
        "test",
        "test p",
        "test p (Holm)",
        "note",
    ]
    assert table["Δ [CI]"].iloc[0].startswith("0.119 [")
    assert format_p(0.0004) == "<0.001" and format_p(0.0123) == "0.012" and format_p(float("nan")) == "–"
