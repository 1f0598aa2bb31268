"""Progress of a long step as log lines: items done (of the total when known), their rate and the ETA.

One reporter for every job: the probe driver (trajectories written), the generation and feature actors,
the index build's encode loop. ``advance`` counts and logs at most one line every ``every_s`` seconds
(0: a line per call), so a busy loop does not flood the log. Where the work's own events are rare or
happen in other processes (an engine compiling, an encoder actor inside a block), a :class:`Heartbeat`
thread asks for the line every :data:`HEARTBEAT_S` seconds instead.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Literal

RATE_UNITS = {"s": 1.0, "min": 60.0}
HEARTBEAT_S = 15.0  # the longest a driver's long step goes without a progress line on the terminal


class Progress:
    """``[label: ]done[/total] unit[, rate/per][, ETA t][, extra]`` every ``every_s`` seconds.

    ``per`` is the time unit of the item rate (None: no item rate, e.g. when ``extra`` says a better one);
    the ETA needs a ``total``; once ``total`` is reached the ETA gives way to the time taken. ``partial``
    is the work done on items not yet done, in items: the ETA counts it (items that run side by side finish
    together, late; counting only finished ones would put the ETA far out early on), the count does not. The clock
    (``clock``, default ``time.monotonic``) starts when the reporter is made, or ``started_ago`` seconds
    before (a reporter made after its work began).
    """

    def __init__(
        self,
        unit: str,
        total: int | None = None,
        *,
        label: str = "",
        every_s: float = 30.0,
        per: Literal["s", "min"] | None = "s",
        log: logging.Logger | None = None,
        clock: Callable[[], float] | None = None,
        started_ago: float = 0.0,
    ):
        self.unit, self.total, self.label, self.every_s, self.per = unit, total, label, every_s, per
        self.log = log or logging.getLogger(__name__)
        self.clock = clock or _monotonic
        self.done = 0
        self.partial = 0.0
        self.logged = self.clock()
        self.started = self.logged - started_ago

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def rate(self, amount: float | None = None) -> float:
        """``amount`` (default: the items done) per second since the start."""
        elapsed = self.elapsed
        return (self.done if amount is None else amount) / elapsed if elapsed > 0 else 0.0

    def line(self, extra: str = "") -> str:
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        parts = [f"{self.label + ': ' if self.label else ''}{count} {self.unit}"]
        rate = self.rate()
        if self.per is not None:
            parts.append(f"{rate * RATE_UNITS[self.per]:.1f}/{self.per}")
        if self.total is not None and self.done >= self.total:
            parts.append(f"took {duration(self.elapsed)}")
        elif self.total is not None:
            work = self.done + self.partial  # under one item's worth the ETA is noise: "?"
            parts.append(f"ETA {duration((self.total - work) * self.elapsed / work if work >= 1 else math.inf)}")
        if extra:
            parts.append(extra)
        return ", ".join(parts)

    def advance(self, n: int = 1, extra: str = "") -> str | None:
        """Count ``n`` more items; log and return the progress line when ``every_s`` has passed since the last."""
        self.done += n
        now = self.clock()
        if now - self.logged < self.every_s:
            return None
        self.logged = now
        text = self.line(extra)
        self.log.info("%s", text)
        return text


class Heartbeat:
    """Calls ``beat`` every ``every_s`` seconds on a daemon thread while the ``with`` block runs.

    A beat that raises is logged at debug level and the next one comes as usual: a progress line must
    never end the work it reports on. The thread is stopped when the block ends (a daemon: a beat that
    hangs does not hold the process).
    """

    def __init__(self, beat: Callable[[], object], every_s: float = HEARTBEAT_S, name: str = "raypipe-progress"):
        self.beat, self.every_s = beat, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)  # a beat in progress ends soon; Ctrl-C must not wait for a slow one

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.beat()
            except Exception:  # a progress line must not end the work
                logging.getLogger(__name__).debug("progress heartbeat failed", exc_info=True)


def waiting(what: str, log: logging.Logger, every_s: float = HEARTBEAT_S) -> Heartbeat:
    """A heartbeat for a step with nothing to count (Ray starting, a service loading its index): logs
    ``what (45s)`` every ``every_s`` seconds, so a slow machine does not look like a hung one."""
    started = _monotonic()
    return Heartbeat(lambda: log.info("%s (%s)", what, duration(_monotonic() - started)), every_s)


def _monotonic() -> float:
    return time.monotonic()  # looked up at each call: tests replace it


def duration(seconds: float) -> str:
    """``4m05s``, ``42s``, or ``?`` for an unknown (infinite) duration."""
    if math.isinf(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
