"""Progress of a long step as log lines: items done (of the total when known), their rate and the ETA.

One reporter for every job: the probe driver (trajectories written), the generation and feature actors,
the index build's encode loop. ``advance`` counts and logs at most one line every ``every_s`` seconds
(0: a line per call), so a busy loop does not flood the log.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Literal

RATE_UNITS = {"s": 1.0, "min": 60.0}


class Progress:
    """``[label: ]done[/total] unit[, rate/per][, ETA t][, extra]`` every ``every_s`` seconds.

    ``per`` is the time unit of the item rate (None: no item rate, e.g. when ``extra`` says a better one);
    the ETA needs a ``total``. The clock starts when the reporter is made.
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
    ):
        self.unit, self.total, self.label, self.every_s, self.per = unit, total, label, every_s, per
        self.log = log or logging.getLogger(__name__)
        self.done = 0
        self.started = self.logged = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

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
        if self.total is not None:
            parts.append(f"ETA {duration((self.total - self.done) / rate if rate > 0 else math.inf)}")
        if extra:
            parts.append(extra)
        return ", ".join(parts)

    def advance(self, n: int = 1, extra: str = "") -> str | None:
        """Count ``n`` more items; log and return the progress line when ``every_s`` has passed since the last."""
        self.done += n
        now = time.monotonic()
        if now - self.logged < self.every_s:
            return None
        self.logged = now
        text = self.line(extra)
        self.log.info("%s", text)
        return text


def duration(seconds: float) -> str:
    """``4m05s``, ``42s``, or ``?`` for an unknown (infinite) duration."""
    if math.isinf(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
