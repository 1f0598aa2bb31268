"""Experiment tracking in MLflow (raypipe.analysis.tracking): stores checked before the work, stage runs logged
to a local file store (and a sqlite database) and read back with MLflow's own client, and (slow) the MLflow UI
over that store opened in headless Chromium.

The UI needs the full ``mlflow`` package, whose pyarrow cap (<26) clashes with the stack's pyarrow 26: raypipe's
``tracking`` extra installs the client (``mlflow-skinny``). The UI test finds an ``mlflow`` with the UI in
``$RAYPIPE_MLFLOW_UI`` (e.g. a separate environment's ``bin/mlflow``) or in this environment, else it is skipped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from raypipe import cli
from raypipe.analysis.tracking import Headline, StageTracker, TrackingError, flat_params, metric_key, store_uri
from raypipe.core.config import TrackingConfig, load_config
from tests.helpers.analysis_run import build_run_dir

mlflow = pytest.importorskip("mlflow", reason="the tracking extra (mlflow-skinny) is not installed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def artifact_paths(client, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def stage_runs(store: Path, experiment: str) -> dict:
    """The MLflow runs of an experiment in a file store, by run name."""
    client = mlflow.MlflowClient(store.resolve().as_uri())
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {store}"
    return client, {r.info.run_name: r for r in client.search_runs([found.experiment_id])}


def test_store_uris_and_param_names():
    assert store_uri("mlruns").startswith("file:///") and store_uri("mlruns").endswith("/mlruns")
    assert store_uri("sqlite:///x/m.db") == f"sqlite:///{Path('x/m.db').resolve()}"
    assert store_uri("http://host:5000") == "http://host:5000"
    assert flat_params({"a": {"b": 1, "c": [1, 2], "d": None, "e": {}}, "f": "x"}) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "a.d": "null",
        "a.e": "{}",
        "f": "x",
    }
    assert metric_key("heuristic[paper] unsup+sup/w3 global.mean_f1") == "heuristic_paper_ unsup_sup/w3 global.mean_f1"


def test_tracking_is_off_by_default(tmp_path):
    tracker = StageTracker.open(load_config().tracking, tmp_path, "report")
    assert not tracker.enabled and tracker.log(load_config()) is None
    assert not any(tmp_path.iterdir())


def test_a_store_that_cannot_be_written_is_one_clear_line_before_the_work(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(TrackingError, match=r"^tracking.mlflow_uri=file:///.*/a-file/store: cannot write to .*") as err:
        StageTracker.open(TrackingConfig(mlflow_uri=str(blocker / "store")), tmp_path, "probe")
    assert "\n" not in str(err.value)
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TrackingError, match=r"^tracking.mlflow_uri=http://127.0.0.1:\d+: the MLflow server does not"):
        StageTracker.open(TrackingConfig(mlflow_uri=closed), tmp_path, "probe")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not installed
    with pytest.raises(TrackingError, match=r"MLflow is not installed: pip install 'raypipe\[tracking\]'"):
        StageTracker.open(TrackingConfig(mlflow_uri=str(tmp_path / "store")), tmp_path, "probe")


def test_the_stage_skeleton_checks_first_and_logs_its_headline(tmp_path, monkeypatch):
    """RunDirStage.main (features, train, sweep, stoprag): the store is checked before the body runs; after it
    the resolved config, the stage's config file and the headline hook's figures and files are logged."""
    import raypipe.runtime.stage_main as stage_main

    monkeypatch.setattr(stage_main, "init_ray", lambda config, log_to_driver: None)  # the body here needs no Ray
    run = build_run_dir(tmp_path / "run-a")
    ran = []

    def body(stage):
        ran.append(stage.tracker.enabled)
        (stage.run.path / "out.csv").write_text("a,b\n1,2\n")
        return 0.25

    stage = stage_main.RunDirStage(
        "demo", "a demo stage", "a run", headline=lambda r, result: Headline({"share": result}, [r.path / "out.csv"])
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(SystemExit, match=r"^error: tracking.mlflow_uri=.*: cannot write to "):
        stage.main(body, [str(run.path), "--set", f"tracking.mlflow_uri={blocker / 'store'}"])
    assert ran == []  # refused before the work
    store = tmp_path / "mlruns"
    stage.main(body, [str(run.path), "--set", f"tracking.mlflow_uri={store}", "--set", "report.correction=bh"])
    assert ran == [True]
    client, runs = stage_runs(store, "run-a")
    logged = runs["demo"]
    assert logged.info.status == "FINISHED"
    assert logged.data.tags["raypipe.stage"] == "demo"
    assert logged.data.tags["raypipe.run_dir"] == str(run.path.resolve())
    assert logged.data.params["report.correction"] == "bh" and logged.data.params["agent.protocol"] == "search_r1"
    assert logged.data.params["tracking.mlflow_uri"] == str(store)
    assert logged.data.metrics == {"share": 0.25}
    assert artifact_paths(client, logged.info.run_id) == {"out.csv", "demo.yaml"}


def test_a_tracking_failure_after_a_finished_stage_is_a_warning(tmp_path, monkeypatch, caplog):
    """The store answered the check before the work, then failed when the finished stage was logged: the stage's
    outputs stand and it ends normally, with a warning naming the failure (before: `error:` and exit 1)."""
    import logging

    import raypipe.runtime.stage_main as stage_main

    monkeypatch.setattr(stage_main, "init_ray", lambda config, log_to_driver: None)

    def store_gone(self, *args):
        raise TrackingError(f"could not log the {self.stage} stage to MLflow at {self.uri} (the server went away)")

    monkeypatch.setattr(StageTracker, "log", store_gone)
    run = build_run_dir(tmp_path / "run-a")
    stage = stage_main.RunDirStage("demo", "a demo stage", "a run")
    with caplog.at_level(logging.WARNING, logger="raypipe.runtime.stage_main"):
        _, result = stage.main(lambda s: 7, [str(run.path), "--set", f"tracking.mlflow_uri={tmp_path / 'mlruns'}"])
    assert result == 7 and (run.path / "demo.yaml").exists()
    assert "the stage finished, but tracking it failed: could not log the demo stage" in caplog.text


def test_compare_logs_its_figures_and_page_to_the_baselines_experiment(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    base, other = build_run_dir(tmp_path / "base"), build_run_dir(tmp_path / "other", protocol="r1_searcher")
    store = tmp_path / "mlruns"
    cli.main(
        [
            "compare",
            str(other.path),
            "--baseline",
            str(base.path),
            "--set",
            "report.bootstrap_samples=50",
            "--set",
            f"tracking.mlflow_uri={store}",
        ]
    )
    client, runs = stage_runs(store, "base")
    logged = runs["compare"]
    params, metrics = logged.data.params, logged.data.metrics
    assert params["compare.baseline"] == str(base.path.resolve()) and params["compare.correction"] == "holm"
    assert json.loads(params["compare.runs"]) == [str(base.path.resolve()), str(other.path.resolve())]
    assert metrics["questions_compared"] == 5  # A-E in both (F failed in both)
    assert metrics["other.final F1.mean_diff"] == 0.0  # the same answers under another protocol label
    assert {"compare/index.html", "compare/compare.md", "compare/tables/paired.csv"} <= artifact_paths(
        client, logged.info.run_id
    )


def test_report_keeps_tracking_a_run_whose_config_tracks(tmp_path, monkeypatch):
    """The report reads its options from --config/--set, not from the run; a run set to track (its config.yaml
    has tracking.mlflow_uri) is still tracked, into a sqlite database here."""
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    run = build_run_dir(tmp_path / "run-r")
    database = tmp_path / "db" / "mlflow.db"
    run.write_config(load_config("embedded", ["name=handbuilt", f"tracking.mlflow_uri=sqlite:///{database}"]))
    cli.main(["report", str(run.path), "--set", "report.bootstrap_samples=20"])
    client = mlflow.MlflowClient(f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("run-r")
    [logged] = client.search_runs([experiment.experiment_id])
    assert logged.info.run_name == "report" and logged.data.metrics["sections_error"] == 0
    assert logged.data.metrics["sections_ok"] >= 3
    assert {"report/index.html", "report/report.md"} <= artifact_paths(client, logged.info.run_id)
    assert (database.parent / "mlartifacts").is_dir()  # artifacts beside the database, not in the working directory


@pytest.mark.parametrize("command", ["sweep", "stoprag", "report", "compare"])
def test_help_names_the_tests_and_tracking(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "tracking.mlflow_uri" in text
    if command in ("sweep", "stoprag"):
        assert "Wilcoxon" in text and "McNemar" in text and "report.correction=bh" in text


# ---------------------------------------------------------------- the MLflow UI in a browser


def mlflow_ui_command() -> list[str] | None:
    """An ``mlflow`` that serves the UI: ``$RAYPIPE_MLFLOW_UI``, or this environment's when it has the UI."""
    if os.environ.get("RAYPIPE_MLFLOW_UI"):
        return [os.environ["RAYPIPE_MLFLOW_UI"]]
    build = Path(mlflow.__file__).parent / "server" / "js" / "build" / "index.html"
    return [sys.executable, "-m", "mlflow"] if build.exists() else None


@pytest.mark.slow
@pytest.mark.skipif(
    mlflow_ui_command() is None,
    reason="no MLflow UI: mlflow-skinny has none; set RAYPIPE_MLFLOW_UI "
    "to the mlflow of an environment with the full mlflow package",
)
def test_the_mlflow_ui_shows_the_tracked_experiment(tmp_path, monkeypatch):
    from raypipe.analysis.screenshot import assert_not_blank, find_browser, rendered_html, screenshot

    if find_browser() is None:
        pytest.skip("no chromium installed (apt-get install -y chromium)")
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    base, other = build_run_dir(tmp_path / "ui-base"), build_run_dir(tmp_path / "ui-other")
    store = tmp_path / "mlruns"
    cli.main(
        [
            "compare",
            str(other.path),
            "--baseline",
            str(base.path),
            "--set",
            "report.bootstrap_samples=20",
            "--set",
            f"tracking.mlflow_uri={store}",
        ]
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            *mlflow_ui_command(),
            "ui",
            "--backend-store-uri",
            store.resolve().as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()[-3000:]
                assert time.monotonic() < deadline, "the MLflow UI did not start in 120 s"
                time.sleep(1)
        with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?max_results=100", timeout=30) as reply:
            experiments = {e["name"]: e["experiment_id"] for e in json.load(reply)["experiments"]}
        assert "ui-base" in experiments
        page = f"{url}/#/experiments/{experiments['ui-base']}/runs"
        dom = rendered_html(page, timeout=120, settle_ms=15000)
        assert "ui-base" in dom and "compare" in dom  # the experiment and its run, drawn by the UI's scripts
        measures = assert_not_blank(
            screenshot(page, tmp_path / "mlflow.png", width=1400, height=900, timeout=120, settle_ms=15000)
        )
        assert measures["colours"] > 200
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # mlflow ui and its uvicorn workers
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    with pytest.raises(OSError):  # stopped: nothing answers on the port any more
        urllib.request.urlopen(f"{url}/health", timeout=5)
