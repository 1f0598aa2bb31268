"""The online controller: the heuristic on predicted P̂/Û inside the agent loop (fake predictor)."""

import asyncio
import json
import pickle
from dataclasses import replace

import pytest

from raypipe.agents import AgentLoop, SearchR1
from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.core.config import AgentConfig
from raypipe.data.loaders import Question
from raypipe.stopping.batching import OneByOne
from raypipe.stopping.cap_online import CapController
from raypipe.stopping.heuristic import HeuristicOptions, Thresholds
from raypipe.stopping.online import BundleLoader, OnlineController
from raypipe.testing.fakes import FakeEngine, FakeRetriever, agent_turns

TH = Thresholds(0.5, 0.0)


class TablePredictor(OneByOne):
    """(P̂, Û) by iteration from a table; records the histories it was asked about."""

    def __init__(self, table):
        self.table = table
        self.calls = []

    def predict(self, history_rows, question):
        self.calls.append([r["iteration"] for r in history_rows])
        return self.table[history_rows[-1]["iteration"]]


def rows(n, qid="q1", dataset="hotpotqa"):
    return [{"qid": qid, "dataset": dataset, "iteration": i, "probe_answer": f"a{i}"} for i in range(n + 1)]


def decide_all(controller, n, qid="q1", dataset="hotpotqa"):
    """Call decide after each iteration 0..n as the loop does; the first stop as (iteration, decision)."""
    history = rows(n, qid, dataset)
    for i in range(n + 1):
        decision = asyncio.run(controller.decide("Q?", history[: i + 1]))
        if decision.stop:
            return i, decision
    return None


def test_requires_a_predictor_and_iteration_one():
    with pytest.raises(ValueError, match="bundle path, a predictor factory or a prediction source"):
        OnlineController(None)
    with pytest.raises(ValueError, match="first_iteration must be 1"):
        OnlineController("b", options=HeuristicOptions(first_iteration=0))
    with pytest.raises(ValueError, match="'\\*' entry"):
        OnlineController("b", {"hotpotqa": TH})


def test_iteration0_continues_without_predicting():
    pred = TablePredictor({})
    ctl = OnlineController(None, TH, predictor_factory=lambda: pred)
    assert asyncio.run(ctl.decide("Q?", rows(0))) == CONTINUE
    assert asyncio.run(ctl.decide("Q?", [])) == CONTINUE
    assert pred.calls == []


def test_state0_stops_and_each_iteration_is_predicted_once():
    pred = TablePredictor({1: (0.2, 0.2), 2: (0.8, 0.1), 3: (0.9, 0.9)})
    ctl = OnlineController(None, TH, predictor_factory=lambda: pred)
    assert decide_all(ctl, 3) == (2, StopDecision(True, 2, "state0"))
    assert pred.calls == [[0, 1], [0, 1, 2]]  # the history up to each predicted iteration


def test_state3_rolls_back():
    pred = TablePredictor({1: (0.8, -0.2), 2: (0.7, -0.1), 3: (0.1, -0.3)})
    ctl = OnlineController(None, (0.5, 0.0), predictor_factory=lambda: pred)
    assert decide_all(ctl, 3) == (3, StopDecision(True, 1, "state3_rollback"))


def test_no_stop_runs_to_the_end():
    pred = TablePredictor({1: (0.2, 0.2), 2: (0.3, -0.1)})
    assert decide_all(OnlineController(None, TH, predictor_factory=lambda: pred), 2) is None


def test_per_dataset_thresholds():
    table = {1: (0.6, 0.1)}
    strict = {"*": TH, "musique": Thresholds(0.7, 0.0)}
    assert decide_all(OnlineController(None, strict, predictor_factory=lambda: TablePredictor(table)), 1) is not None
    ctl = OnlineController(None, strict, predictor_factory=lambda: TablePredictor(table))
    assert decide_all(ctl, 1, dataset="musique") is None
    assert ctl.thresholds_for("musique") == Thresholds(0.7, 0.0) and ctl.thresholds_for(None) == TH


def test_pickles_without_its_loaded_state():
    pred = TablePredictor({1: (0.2, 0.2)})
    ctl = OnlineController("some/bundle", TH)
    assert ctl.source.factory == BundleLoader("some/bundle")  # the bundle, loaded on first use
    ctl.source.factory = lambda: pred
    asyncio.run(ctl.decide("Q?", rows(1)))
    assert ctl.source.batcher is not None and ctl.source.batcher.predicted == 1
    ctl.source.factory = BundleLoader("some/bundle")  # a lambda does not pickle; a generation actor gets the loader
    clone = pickle.loads(pickle.dumps(ctl))
    assert clone.source.batcher is None and not clone._predictions
    assert clone.bundle_path == "some/bundle" and clone.thresholds == {"*": TH}
    assert clone.source.factory == BundleLoader("some/bundle")


def test_from_selected_checks_the_head(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"feature_group": "unsup+sup", "window": 3}))
    entry = {
        "feature_group": "unsup+sup",
        "window": 3,
        "variant": "delta_p",
        "thresholds": {"*": {"theta_p": 0.2, "theta_u": 0.1}, "musique": {"theta_p": 0.4, "theta_u": 0.0}},
    }
    selected = tmp_path / "selected.json"
    selected.write_text(json.dumps({"best": entry, "faithful": {**entry, "window": 1}}))
    ctl = OnlineController.from_selected(selected, tmp_path, "best")
    assert ctl.options == HeuristicOptions(utility="delta_p")
    assert ctl.thresholds == {"*": Thresholds(0.2, 0.1), "musique": Thresholds(0.4, 0.0)}
    with pytest.raises(ValueError, match="bundle .* holds unsup\\+sup/w3"):
        OnlineController.from_selected(selected, tmp_path, "faithful")


def test_the_probe_jobs_controller_is_the_registrys_heuristic_on_the_bundle(tmp_path):
    """`raypipe probe --controller PATH`: the heuristic policy of stopping/policies.py, with config.stopping's
    thresholds and variant, on the bundle PATH names (a bundle folder or a run directory's models/)."""
    from raypipe.core.config import load_config
    from raypipe.stopping.policies import POLICIES, controller_on_bundle

    config = load_config(overrides=["stopping.theta_p=0.25", "stopping.variant=best_rollback"])
    with pytest.raises(FileNotFoundError, match="no predictor bundle"):
        controller_on_bundle(tmp_path, config)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "manifest.json").write_text("{}")
    ctl = controller_on_bundle(tmp_path, config)  # a run directory: the bundle under models/
    assert isinstance(ctl, OnlineController)
    assert ctl.source.factory == BundleLoader(str(tmp_path / "models"), config.model_dump(mode="json"))
    assert ctl.thresholds == {"*": Thresholds(0.25, 0.2)} and ctl.options == HeuristicOptions(rollback="best")
    built, calls = CapController(1), []  # the registry's entry builds it: swap the entry, see what comes back
    heuristic = POLICIES["heuristic"]
    POLICIES["heuristic"] = replace(
        heuristic, build=lambda policy, loaded: calls.append((policy, loaded)) or (built, "")
    )
    try:
        assert controller_on_bundle(tmp_path, config) is built
    finally:
        POLICIES["heuristic"] = heuristic
    [(policy, loaded)] = calls
    assert policy.name == "heuristic" and loaded.stopping == config.stopping
    assert loaded.predictor.factory == BundleLoader(str(tmp_path / "models"), config.model_dump(mode="json"))


# ---------------------------------------------------------------- inside the agent loop

Q = Question(qid="q1", dataset="toy", question="Who wrote Hamlet", golden_answers=["William Shakespeare"])
SEARCH_1 = "<think> I need the author. </think>\n<search> Hamlet author </search>"
SEARCH_2 = "<think> Check again. </think>\n<search> Shakespeare </search>"
SEARCH_3 = "<think> And again. </think>\n<search> Stratford </search>"
ANSWER = "<think> Found it. </think>\n<answer> William Shakespeare </answer>"


def probe(prompt):
    return " William Shakespeare </answer>" if "passage 0 about Shakespeare" in prompt else " Marlowe </answer>"


class ProbePredictor(OneByOne):
    """Confident once the probe says Shakespeare: what a good quality head would do."""

    def predict(self, history_rows, question):
        good = "Shakespeare" in (history_rows[-1]["probe_answer"] or "")
        return (0.9, 0.5) if good else (0.1, 0.1)


def run_loop(controller):
    engine = FakeEngine(agent_turns([SEARCH_1, SEARCH_2, SEARCH_3, ANSWER], probe))
    loop = AgentLoop(
        engine,
        FakeRetriever(n=5),
        SearchR1("pyterrier"),
        AgentConfig(max_turns=5),
        top_k=3,
        deep_k=5,
        controller=controller,
    )
    return asyncio.run(loop.run(Q)), engine


def test_stops_the_trajectory_in_flight_and_saves_generation():
    natural, natural_engine = run_loop(None)
    stopped, engine = run_loop(OnlineController(None, TH, predictor_factory=ProbePredictor))
    assert natural.trajectory["n_iterations"] == 3 and natural.trajectory["stop_reason"] == "answer"
    t = stopped.trajectory
    assert t["stop_reason"] == "controller" and t["final_answer"] == "William Shakespeare" and t["final_f1"] == 1.0
    assert [r["iteration"] for r in stopped.iterations] == [0, 1, 2]
    assert len(engine.requests) < len(natural_engine.requests)
    assert t["tokens_generated"] < natural.trajectory["tokens_generated"]
    assert all(r["decision_s"] > 0 for r in stopped.iterations)  # each decision timed on its row
    assert all(r["decision_s"] is None for r in natural.iterations)  # no controller: null
    assert "decision_s" not in t and "decision_s" not in natural.trajectory


@pytest.mark.filterwarnings("ignore:Stochastic Optimizer")
def test_with_a_real_predictor_bundle(tmp_path):
    """The controller against raypipe.predict.bundle: heads fit on one signal that the rows carry."""
    import pickle as pk

    import numpy as np

    from raypipe.core.config import TrainConfig
    from raypipe.predict.bundle import PredictorBundle
    from raypipe.predict.head import fit_head

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(200, 1))
    cfg = TrainConfig(head_batch_size=32)
    for short, y in (("p", x[:, 0]), ("u", x[:, 0] - 0.5)):  # P̂ follows the signal, Û = signal - 0.5
        with open(tmp_path / f"head_{short}.pkl", "wb") as fh:
            pk.dump(fit_head(x, y, cfg), fh)
    manifest = {
        "feature_group": "prob",
        "window": 1,
        "feature_columns": ["signal"],
        "crossencoders": {},
        "train": {"max_tokens": 64, "field_chars": 256, "title_chars": 128},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    ctl = OnlineController(None, Thresholds(0.6, 0.0), predictor_factory=lambda: PredictorBundle.load(tmp_path))
    history = [{**r, "signal": s} for r, s in zip(rows(3), [None, 0.2, 0.3, 0.95])]
    decisions = [asyncio.run(ctl.decide("Q?", history[: i + 1])) for i in range(4)]
    assert [d.stop for d in decisions] == [False, False, False, True]
    assert decisions[-1].answer_iteration == 3
