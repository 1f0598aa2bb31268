"""The Stop-RAG stage end to end on a synthetic run directory (tiny encoder, fake LLM-Stop engine)."""

import asyncio
import json
import pickle

import pandas as pd
import pytest

from raypipe.core.config import load_config
from raypipe.stages.stoprag import run_stoprag
from raypipe.stoprag.splits import split_three
from raypipe.testing.fakes import FakeEngine, replies
from tests.helpers.runs import write_run, write_stoprag_run


def test_split_three_partitions():
    qids = [f"q{i}" for i in range(300)]
    s = split_three(qids, (0.6, 0.2, 0.2), 0)
    assert s.train | s.val | s.test == set(qids)
    assert not (s.train & s.val or s.train & s.test or s.val & s.test)
    assert 140 < len(s.train) < 220 and len(s.val) > 30 and len(s.test) > 30
    assert split_three(qids, (0.6, 0.2, 0.2), 0) == s


def test_an_old_runs_stoprag_worker_keys_load_under_their_new_names(tmp_path):
    import yaml

    from raypipe.core.config import dump_config
    from raypipe.core.jobargs import job_parser, run_config_from_args

    dump_config(load_config(), tmp_path / "config.yaml")
    tree = yaml.safe_load((tmp_path / "config.yaml").read_text())
    tree["stoprag"] = {
        **{k: v for k, v in tree["stoprag"].items() if k not in ("num_workers", "cpus_per_worker")},
        "workers": 3,
        "worker_num_cpus": 0.5,
        "epochs": 4,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))
    args = job_parser("test").parse_args(["--set", "stoprag.epochs=7"])
    config = run_config_from_args(args, tmp_path)
    assert (config.stoprag.num_workers, config.stoprag.cpus_per_worker, config.stoprag.epochs) == (3, 0.5, 7)


@pytest.mark.slow
def test_stage_end_to_end(tmp_path, tiny_encoder, ray_local):
    run = write_stoprag_run(tmp_path / "run", predictions=True)
    config = load_config(
        overrides=[
            f"stoprag.encoder={tiny_encoder}",
            "stoprag.epochs=1",
            "stoprag.num_workers=1",  # max_length: the encoder's
            "stoprag.batch_size=8",
            "stoprag.split=[0.5,0.25,0.25]",
            "stoprag.llm_stop_max_questions=3",
        ]
    )
    outputs = iter(["Decision: <STOP>", "<CONTINUE>", "gibberish"] * 20)
    report = run_stoprag(run, config, llm_stop=True, engine_factory=lambda engine_config: FakeEngine(replies(outputs)))
    table = report.table.set_index("controller")
    assert {"natural", "cap@1", "heuristic", "stoprag", "llm_stop"} <= set(table.index)
    assert table.loc["natural", "f1_share"] == pytest.approx(1.0)
    assert table.loc["stoprag", "questions"] == report.splits["test"]
    assert table.loc["llm_stop", "questions"] == 3
    assert (
        0 < table.loc["heuristic", "questions"] <= table.loc["natural", "questions"]
    )  # only questions with predictions
    assert table.loc["stoprag", "mean_iterations"] <= table.loc["natural", "mean_iterations"] + 1e-9
    out = report.out
    for name in (
        "comparison.csv",
        "comparison.md",
        "comparison.png",
        "outcomes.parquet",
        "margins.parquet",
        "llm_stop.parquet",
        "training.csv",
        "qnet/qnet.json",
    ):
        assert (out / name).exists(), name
    assert "threshold" in json.loads((out / "qnet/qnet.json").read_text())
    from raypipe.stoprag.qnet import StopRagController

    controller = pickle.loads(pickle.dumps(StopRagController(out / "qnet")))  # travels to actors, loads lazily
    history = [
        {"iteration": 0, "doc_titles": [], "doc_texts": []},
        {"iteration": 1, "query": "q", "doc_ids": ["x"], "doc_titles": ["T"], "doc_texts": ["text"]},
    ]
    assert not asyncio.run(controller.decide("Q?", history[:1])).stop  # before first_decision
    margin = controller.margin("Q?", history)
    assert asyncio.run(controller.decide("Q?", history)).stop == (margin > controller.threshold)
    csv = pd.read_csv(out / "comparison.csv")
    assert csv["controller"].tolist() == report.table["controller"].tolist()
    # one answer generator scored every controller, and the table names it
    assert csv["answers"].nunique() == 1 and "probed answer" in csv["answers"][0]
    assert "F1 of every controller: answers: the agent's probed answer" in (out / "comparison.md").read_text()
    # every controller against natural stopping, per question (LLM-Stop on its own questions)
    header = "| F1 p (t / signed-rank) | EM p (McNemar) | iterations p (signed-rank) |"
    assert header in (out / "comparison.md").read_text()
    tests = pd.read_csv(out / "significance.csv")
    assert {"cap@1", "heuristic", "stoprag", "llm_stop"} <= set(tests["system"])
    assert "natural" not in set(tests["system"])
    assert (tests.loc[tests["system"] == "llm_stop", "n"] == 3).all()
    assert csv.loc[csv["controller"] == "stoprag", "f1_test_p_adj"].between(0, 1).all()
    # EM and F1 of one answer per state: an exact answer has F1 1 (the bundled rule scores both)
    outcomes = pd.read_parquet(out / "outcomes.parquet")
    assert (outcomes.loc[outcomes["em"] == 1.0, "f1"] == 1.0).all()
    meta = json.loads((out / "qnet/qnet.json").read_text())
    assert meta["max_length"] == 128 and meta["docs_per_iteration"] == 1 and meta["state_truncation"] == "newest"
    llm = pd.read_parquet(out / "llm_stop.parquet")
    assert set(llm["source"]) <= {"decision_line", "text", "default_neither"} and len(llm) > 0  # the reference parser


def test_train_run_split_trains_and_tunes_on_the_training_run():
    """Paper protocol for Stop-RAG with --train-run: train/val from the training run's questions in the
    ratio of stoprag.split's first two shares, every target question a test question; overlap fails."""
    from raypipe.stopping.replay import Trajectory
    from raypipe.stoprag.splits import split_train_run

    def traj(qid):
        return Trajectory(qid, "hotpotqa", (0.0, 1.0), (1, 1), 1.0, 2)

    train_t = [traj(f"t{i}") for i in range(200)]
    target_t = [traj(f"d{i}") for i in range(30)]
    splits = split_train_run(train_t, target_t, (0.6, 0.2, 0.2), seed=0)
    assert splits.train | splits.val == {t.qid for t in train_t} and not splits.train & splits.val
    assert splits.test == {t.qid for t in target_t}
    assert 0.15 < len(splits.val) / 200 < 0.35  # 0.2 / (0.6 + 0.2) = 0.25
    with pytest.raises(ValueError, match="1 questions are in both"):
        split_train_run(train_t, [traj("t3")], (0.6, 0.2, 0.2), seed=0)


def test_stacked_run_reads_both_runs(tmp_path):
    from raypipe.core.train_run import StackedRun

    a = write_run(tmp_path / "a", n_questions=3, prefix="a")
    b = write_run(tmp_path / "b", n_questions=2, prefix="b")
    both = StackedRun(a, b)
    assert both.path == b.path and both.has("iterations") and not both.has("predictions")
    assert both.read("trajectories", ["qid"]).column("qid").to_pylist() == ["a0", "a1", "a2", "b0", "b1"]
