import numpy as np
import pandas as pd
import pytest

from raypipe.analysis import stats
from raypipe.analysis.report import ReportContext, RunMeta
from raypipe.core.config import ReportConfig
from tests.helpers.analysis_run import build_run_dir

EPS = 1e-6


@pytest.fixture
def frames(tmp_path):
    run = build_run_dir(tmp_path / "run")
    ctx = ReportContext(run, tmp_path / "out", ReportConfig(), RunMeta.read(run))
    return ctx.frames()


@pytest.fixture
def summary(frames):
    return stats.trajectory_summary(*frames, EPS)


def row(frame, dataset, agent="search_r1"):
    match = frame[(frame["agent"] == agent) & (frame["dataset"] == dataset)]
    assert len(match) == 1, match
    return match.iloc[0]


def test_agent_comes_from_run_config(frames):
    iterations, trajectories = frames
    assert set(iterations["agent"]) == set(trajectories["agent"]) == {"search_r1"}


def test_trajectory_summary_per_question(summary):
    s = summary.set_index("qid")
    assert s.loc["A", "net_group"] == "positive" and s.loc["D", "net_group"] == "positive"
    assert s.loc["B", "net_group"] == "zero" and s.loc["E", "net_group"] == "zero"
    assert s.loc["C", "net_group"] == "negative" and pd.isna(s.loc["F", "net_group"])
    assert s["oracle_iteration"].loc[["A", "B", "C", "D", "E"]].tolist() == [2, 0, 0, 1, 0]
    assert s["extra_iterations"].loc[["A", "B", "C", "D", "E"]].tolist() == [0, 3, 1, 2, 0]
    assert s["reached_early"].loc[["A", "B", "C", "D", "E"]].tolist() == [False, True, True, True, False]
    assert s.loc["C", "oracle_p"] == pytest.approx(1.0)  # the oracle stops at the better, earlier answer
    assert s["natural"].tolist() == [True, True, True, True, True, False]


def test_table2_by_hand(summary):
    t2 = stats.table2(summary)
    hp = row(t2, "hotpotqa")
    assert (hp["questions"], hp["errors"]) == (4, 0)
    assert hp["P_0"] == pytest.approx(0.375)
    assert hp["final F1"] == pytest.approx(0.75)
    assert hp["ΔF1"] == pytest.approx(0.375)
    assert hp["mean U_i"] == pytest.approx(1.5 / 9)
    assert hp["mean iterations"] == pytest.approx(2.25)
    mu = row(t2, "musique")
    assert (mu["questions"], mu["errors"]) == (1, 1)  # F's engine error is counted, not analysed
    assert mu["final F1"] == pytest.approx(0.25) and mu["ΔF1"] == pytest.approx(0.0)
    assert np.isnan(mu["mean U_i"])  # no iteration after probe 0
    pooled = row(t2, stats.ALL)
    assert (pooled["questions"], pooled["errors"]) == (5, 1)
    assert pooled["P_0"] == pytest.approx(0.35)
    assert pooled["final F1"] == pytest.approx(0.65)
    assert pooled["ΔF1"] == pytest.approx(0.3)
    assert pooled["mean U_i"] == pytest.approx(1.5 / 9)
    assert pooled["mean iterations"] == pytest.approx(9 / 5)


def test_utility_distribution_by_hand(summary):
    hp = row(stats.utility_distribution(summary), "hotpotqa")
    assert hp["iterations"] == 9
    assert (hp["zero"], hp["positive"], hp["negative"]) == pytest.approx((5 / 9, 3 / 9, 1 / 9))


def test_net_utility_groups_by_hand(summary):
    groups = stats.net_utility_groups(summary)
    hp, pooled = row(groups, "hotpotqa"), row(groups, stats.ALL)
    assert (hp["positive"], hp["zero"], hp["negative"]) == (2, 1, 1)
    assert (pooled["trajectories"], pooled["zero"], pooled["zero share"]) == (5, 2, pytest.approx(0.4))


def test_quality_by_iteration_by_hand(frames, summary):
    curves = stats.quality_by_iteration(frames[0], summary, pooled=True)
    got = {
        (g, i): (m, n)
        for g, i, m, n in curves[["net_group", "iteration", "mean_p", "trajectories"]].itertuples(index=False)
    }
    assert got[("positive", 0)] == (pytest.approx(0.0), 2)
    assert got[("positive", 1)] == (pytest.approx(0.75), 2)
    assert got[("positive", 3)] == (pytest.approx(1.0), 1)
    assert got[("zero", 0)] == (pytest.approx(0.375), 2)
    assert got[("zero", 1)] == (pytest.approx(0.5), 1)
    assert got[("negative", 1)] == (pytest.approx(0.5), 1)
    assert len(curves) == 4 + 4 + 2
    per_dataset = stats.quality_by_iteration(frames[0], summary, pooled=False)
    assert set(per_dataset["dataset"]) == {"hotpotqa", "musique"}


def test_oracle_by_hand(summary):
    oracle = stats.oracle_table(summary)
    hp = row(oracle, "hotpotqa")
    assert (hp["trajectories"], hp["early"]) == (4, 3)
    assert hp["early share"] == pytest.approx(0.75)
    assert hp["extra iter. (early)"] == pytest.approx(2.0)
    assert hp["natural iter."] == pytest.approx(2.25)
    assert hp["oracle iter."] == pytest.approx(0.75)
    assert hp["iter. saved"] == pytest.approx(6 / 9)
    assert (hp["final P"], hp["oracle P"]) == (pytest.approx(0.75), pytest.approx(0.875))
    mu = row(oracle, "musique")
    assert (mu["trajectories"], mu["early"]) == (1, 0)  # the engine error is not a natural stop
    assert np.isnan(mu["iter. saved"])
    pooled = row(oracle, stats.ALL)
    assert pooled["early share"] == pytest.approx(0.6)


def test_epsilon_decides_zero_utility():
    values = np.array([0.0, 0.005, -0.005, 0.02, -0.5, np.nan])
    assert stats.sign_class(values, 1e-6).tolist() == ["zero", "positive", "negative", "positive", "negative", None]
    assert stats.sign_class(values, 0.01).tolist() == ["zero", "zero", "zero", "positive", "negative", None]


def test_oracle_with_tolerance_reaches_final_within_epsilon():
    its = pd.DataFrame(
        {
            "agent": "a",
            "dataset": "d",
            "qid": "q",
            "iteration": [0, 1, 2],
            "probe_f1": [0.495, 0.3, 0.5],
            "utility": [None, -0.195, 0.2],
        }
    )
    traj = pd.DataFrame(
        {
            "agent": ["a"],
            "dataset": ["d"],
            "qid": ["q"],
            "final_f1": [0.5],
            "n_iterations": [2],
            "stop_reason": ["answer"],
        }
    )
    assert stats.trajectory_summary(its, traj, 1e-6)["oracle_iteration"].item() == 2
    assert stats.trajectory_summary(its, traj, 0.01)["oracle_iteration"].item() == 0


def test_agents_are_kept_apart(frames):
    iterations, trajectories = frames
    both_its = pd.concat([iterations, iterations.assign(agent="r1_searcher")])
    both_traj = pd.concat([trajectories, trajectories.assign(agent="r1_searcher")])
    t2 = stats.table2(stats.trajectory_summary(both_its, both_traj, EPS))
    assert len(t2) == 6  # 2 agents x (2 datasets + all)
    assert row(t2, "hotpotqa", "r1_searcher")["final F1"] == pytest.approx(0.75)


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="probe_f1"):
        stats.trajectory_summary(pd.DataFrame({"qid": []}), pd.DataFrame(), EPS)


def test_failed_trajectories_are_left_out_but_partial_iterations_do_not_leak(frames):
    iterations, trajectories = frames
    # G: two probes, then the engine died; its iterations must not enter U_i or the curves.
    its = pd.concat(
        [
            iterations,
            pd.DataFrame(
                {
                    "agent": "search_r1",
                    "dataset": "musique",
                    "qid": "G",
                    "iteration": [0, 1],
                    "probe_f1": [0.0, 1.0],
                    "utility": [None, 1.0],
                }
            ),
        ]
    )
    trajs = pd.concat(
        [
            trajectories,
            pd.DataFrame(
                {
                    "agent": ["search_r1"],
                    "dataset": ["musique"],
                    "qid": ["G"],
                    "final_f1": [0.0],
                    "n_iterations": [1],
                    "stop_reason": ["engine_error"],
                }
            ),
        ]
    )
    summary = stats.trajectory_summary(its, trajs, EPS)
    assert row(stats.table2(summary), "musique")["errors"] == 2
    assert row(stats.utility_distribution(summary), "musique")["iterations"] == 0
    assert row(stats.net_utility_groups(summary), "musique")["trajectories"] == 1
    assert "G" not in set(stats.usable_iterations(its, summary)["qid"])
    curves = stats.quality_by_iteration(its, summary)
    positive0 = curves[(curves["net_group"] == "positive") & (curves["iteration"] == 0)]
    assert positive0["trajectories"].item() == 2  # A and D; G (net +1) failed
