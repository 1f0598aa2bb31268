"""``raypipe dashboard``: TensorBoard over a run's Tune logs, opened in headless Chromium.

The slow test builds a real (tiny) Tune experiment where the sweep keeps its own, starts the command on a
free port, reads the trials back from TensorBoard's data endpoints, screenshots the scalars page and
stops the server with SIGTERM. Skipped only outside CI when no Chromium is installed.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from raypipe import cli
from raypipe.analysis.dashboard_logs import DashboardError, log_roots, logdir_spec
from raypipe.analysis.screenshot import assert_not_blank, find_browser, screenshot

ROOT = Path(__file__).resolve().parents[1]
HEADS = ("unsup_w1", "all_w3")  # one trial each, as the sweep runs one per prediction head


def _run_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("name: dash\n")
    return path


def test_log_roots_name_the_folders_with_event_files(tmp_path):
    run = _run_dir(tmp_path / "run")
    (run / "stopping" / "tune" / "sweep-1" / "trial_0").mkdir(parents=True)
    (run / "stopping" / "tune" / "sweep-1" / "trial_0" / "events.out.tfevents.1.host").write_bytes(b"")
    (run / "stoprag" / "tables").mkdir(parents=True)  # a stage folder without event files is left out
    assert log_roots(run) == {"sweep": run / "stopping" / "tune"}
    (run / "models" / "ray_train" / "ce").mkdir(parents=True)
    (run / "models" / "ray_train" / "ce" / "events.out.tfevents.2.host").write_bytes(b"")
    roots = log_roots(run)
    assert list(roots) == ["sweep", "train"]
    assert logdir_spec(roots) == f"sweep:{(run / 'stopping' / 'tune').resolve()},train:{(run / 'models').resolve()}"


def test_bad_run_directories_get_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])  # cli.main sets it for the command
    with pytest.raises(DashboardError, match="does not exist"):
        log_roots(tmp_path / "nope")
    with pytest.raises(DashboardError, match="is not a run directory"):
        log_roots(tmp_path)
    run = _run_dir(tmp_path / "run")
    with pytest.raises(SystemExit, match=r"^error: no TensorBoard logs in .*`raypipe sweep .*` writes them$"):
        cli.main(["dashboard", str(run)])


@pytest.mark.parametrize("command", ["dashboard", "compare"])
def test_new_commands_have_help(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: raypipe {command}" in out and cli.job_summary(command) in out
    assert command in cli.usage()


def _tiny_sweep(run: Path) -> list[str]:
    """A Tune experiment like the sweep's (one trial per head, one report per heuristic variant) where the
    sweep keeps it; the trial folder names. Ray must be up."""
    from ray import tune

    def trial(config):
        for step in range(3):
            tune.report(
                {
                    "variant_index": step,
                    "test_mean_f1": 0.1 * step + len(config["head"]) / 100,
                    "test_iterations_change": -0.1 * step,
                }
            )

    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": 1}),
        param_space={"head": tune.grid_search(list(HEADS))},
        run_config=tune.RunConfig(
            storage_path=str((run / "stopping" / "tune").resolve()), name="sweep-test", verbose=0
        ),
    )
    return [Path(result.path).name for result in tuner.fit()]


def _stdout_lines(proc: subprocess.Popen) -> queue.Queue:
    """The command's output lines as they come (a thread: select() cannot see lines already buffered)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return lines


def _read_url(proc: subprocess.Popen, lines: queue.Queue, timeout: float = 120) -> str:
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(lines.get(timeout=1.0))
        except queue.Empty:
            continue
        if seen[-1].startswith("TensorBoard: "):
            return seen[-1].split()[1].split("#")[0]
    raise AssertionError(f"no URL from raypipe dashboard (exit {proc.poll()}): {''.join(seen)}")


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
@pytest.mark.skipif(
    find_browser() is None and not os.environ.get("CI"),
    reason="no chromium installed (apt-get install -y chromium); required when CI is set",
)
def test_dashboard_serves_the_sweeps_trials_in_a_browser(tmp_path, ray_local):
    assert find_browser() is not None, "CI must install chromium: apt-get install -y chromium"
    run = _run_dir(tmp_path / "run")
    trials = _tiny_sweep(run)
    assert len(trials) == len(HEADS)
    log = tmp_path / "dashboard.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raypipe", "dashboard", str(run), "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    lines = _stdout_lines(proc)
    try:
        url = _read_url(proc, lines)
        deadline = time.monotonic() + 60
        while (runs := _get_json(url + "data/runs")) and len(runs) < len(trials) and time.monotonic() < deadline:
            time.sleep(1)  # TensorBoard loads the event files in the background
        assert sorted(runs) == sorted(f"sweep/sweep-test/{t}" for t in trials)
        tags = _get_json(url + "data/plugin/scalars/tags")
        assert all({"ray/tune/test_mean_f1", "ray/tune/test_iterations_change"} <= set(tags[r]) for r in runs)
        png = screenshot(url + "#scalars", tmp_path / "scalars.png", width=1280, height=900, settle_ms=10_000)
        measures = assert_not_blank(png)
        assert measures["colours"] > 200  # the header, the run list and drawn curves, not an empty page
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()
    time.sleep(0.5)  # the reader thread takes the last lines
    assert list(lines.queue)[-1] == "TensorBoard stopped\n"
