"""The progress reporter every job logs with, and where Ray Data's own progress goes (no Ray started)."""

import io
import logging
import math

from raypipe.core import progress as progress_module
from raypipe.core.progress import Progress, duration
from raypipe.runtime.cluster import RAY_DATA_LOG, route_ray_data_logs


def test_line_has_count_rate_and_eta(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    progress = Progress("trajectories", 10, every_s=0, per="min")
    now[0] = 160.0  # a minute later
    assert progress.advance(2) == "2/10 trajectories, 2.0/min, ETA 4m00s"


def test_lines_are_spaced_and_extras_appended(caplog):
    quiet = Progress("trajectories finished", label="actor", every_s=3600, per=None)
    assert quiet.advance() is None and quiet.done == 1  # counted, but no line yet
    loud = Progress("trajectories finished", label="actor", every_s=0, per=None, log=logging.getLogger("x"))
    with caplog.at_level("INFO", logger="x"):
        line = loud.advance(1, "2 in flight, 30 tokens/s in finished trajectories")
    assert line == "actor: 1 trajectories finished, 2 in flight, 30 tokens/s in finished trajectories"
    assert [r.getMessage() for r in caplog.records] == [line]


def test_duration():
    assert (duration(42.9), duration(245), duration(math.inf)) == ("42s", "4m05s", "?")


def fake_ray_data_logger() -> tuple[logging.Logger, io.StringIO]:
    console = io.StringIO()
    logger = logging.getLogger("test_progress.ray.data")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logging.StreamHandler(console))
    return logger, console


def test_ray_data_progress_goes_to_the_run_log_off_a_terminal(tmp_path):
    logger, console = fake_ray_data_logger()
    path = route_ray_data_logs(tmp_path / "logs", interactive=False, logger=logger)
    assert path == tmp_path / "logs" / RAY_DATA_LOG
    logger.info("======= Running Dataset: dataset_1 =======")
    logger.warning("an actor died")
    assert console.getvalue() == "an actor died\n"  # warnings stay on the terminal
    text = path.read_text()
    assert "Running Dataset" in text and "an actor died" in text

    again = route_ray_data_logs(tmp_path / "other", interactive=False, logger=logger)  # a later run in this process
    logger.info("next")
    assert "next" in again.read_text() and "next" not in path.read_text()
    assert sum(isinstance(h, logging.FileHandler) for h in logger.handlers) == 1


def test_ray_data_keeps_its_progress_bars_on_a_terminal(tmp_path):
    logger, console = fake_ray_data_logger()
    assert route_ray_data_logs(tmp_path / "logs", interactive=True, logger=logger) is None
    logger.info("bar")
    assert console.getvalue() == "bar\n" and not (tmp_path / "logs").exists()
