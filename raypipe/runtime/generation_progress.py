"""The probe driver's generation line, every :data:`~raypipe.core.progress.HEARTBEAT_S` seconds while the
generation actors work.

Ray Data hands the driver a batch only when its slowest trajectory is done (8 questions: minutes on a
CPU), and the actors' own lines stay in their log files. So a driver thread reads the crash ledger
(:mod:`raypipe.runtime.crashes`), which hears every trajectory's start and finish and every engine's
start, and logs what it says::

    generation: starting the generation actors (15s)
    generation: engine starting (45s; a first start compiles the model, a few minutes on CPU)
    generation: 4/12 trajectories, 2.1/min, ETA 3m10s, 8 in flight, engine started in 52s
    generation: 12/12 trajectories, 3.1/min, took 3m52s, 0 in flight

The rate counts from the first trajectory's start, so the engine's start does not dilute it. The ETA also
counts the turns the trajectories in flight have done, each a share of its turn limit: trajectories run side
by side and finish late and together, so finished ones alone would put it minutes out early on. An engine
death the actors report is a warning (Ray restarts the actor and its questions run again); when the
generation fails, :func:`show_actor_logs` puts the end of each actor's log file on the terminal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from raypipe.core.config import RunConfig
from raypipe.core.progress import HEARTBEAT_S, Heartbeat, Progress, duration
from raypipe.runtime.crashes import GenerationStatus

log = logging.getLogger(__name__)


def engine_start_hint(config: RunConfig) -> str:
    """What the engine-starting line adds: vLLM compiles the model on its first start on a machine
    (its compile cache makes later starts shorter) unless ``engine.enforce_eager``."""
    if config.engine.backend != "vllm" or config.engine.enforce_eager:
        return ""
    on_cpu = config.generation.actor_num_gpus == 0
    return "a first start compiles the model" + (", a few minutes on CPU" if on_cpu else "")


class GenerationReporter:
    """Turns the ledger's :class:`~raypipe.runtime.crashes.GenerationStatus` into the generation line;
    ``written`` counts the trajectories the driver wrote (:meth:`wrote`). ``turn_limit`` (the agent's
    resolved ``max_turns``; None: the ETA counts finished trajectories only) weighs the turns in flight."""

    def __init__(
        self,
        total: int,
        engine_hint: str = "",
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger = log,
        turn_limit: int | None = None,
    ):
        self.total, self.engine_hint, self.clock, self.log = total, engine_hint, clock, log
        self.turn_limit = turn_limit
        self.created = clock()
        self.written = 0
        self._progress: Progress | None = None  # made at the first trajectory's start
        self._ready = self._deaths = 0

    def wrote(self, n: int) -> None:
        self.written += n

    def report(self, status: GenerationStatus) -> str:
        """Log the line for ``status`` (and a warning per engine death not yet reported); returns the line."""
        if status.deaths > self._deaths:
            self.log.warning(
                "generation: an engine died (%s); Ray restarts its actor and the questions it had in flight run again",
                status.last_error,
            )
            self._deaths = status.deaths
        text = self.line(status)
        self.log.info("%s", text)
        return text

    def line(self, status: GenerationStatus) -> str:
        if status.started == 0 and self.written == 0:
            if status.engines_starting:
                hint = f"; {self.engine_hint}" if self.engine_hint else ""
                return f"generation: engine starting ({duration(status.starting_s)}{hint})"
            return f"generation: starting the generation actors ({duration(self.clock() - self.created)})"
        if self._progress is None:
            self._progress = Progress(
                "trajectories",
                self.total,
                label="generation",
                every_s=0,
                per="min",
                log=self.log,
                clock=self.clock,
                started_ago=status.running_s,
            )
        self._progress.done = min(self.total, max(status.finished, self.written))
        if self.turn_limit:  # a turn limit's last turn may still end in a forced answer: in flight, never whole
            self._progress.partial = status.turns_in_flight / (self.turn_limit + 1)
        extra = [f"{status.in_flight} in flight"]
        if status.engines_ready > self._ready and status.last_start_s is not None:
            extra.append(f"engine started in {duration(status.last_start_s)}")
        self._ready = status.engines_ready
        if status.engines_starting:
            extra.append(f"{status.engines_starting} engine{'s' if status.engines_starting > 1 else ''} starting")
        return self._progress.line(", ".join(extra))

    def heartbeat(self, read_status: Callable[[], GenerationStatus], every_s: float = HEARTBEAT_S) -> Heartbeat:
        """The thread that reports ``read_status()`` every ``every_s`` seconds (a ``with`` block)."""
        return Heartbeat(lambda: self.report(read_status()), every_s, name="raypipe-generation-progress")


def show_actor_logs(log_dir: Path, lines: int = 20, log: logging.Logger = log) -> None:
    """Log the last ``lines`` lines of each generation actor's log file in ``log_dir``: where an engine's
    start error explains itself (vLLM's "See root cause above" points into that file)."""
    for path in sorted(Path(log_dir).glob("generation-*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        log.error("the last %d lines of %s:\n%s", len(tail), path, "\n".join(tail))
