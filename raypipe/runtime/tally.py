"""A count that Ray workers add to and the driver reads: progress made inside other processes, as it is
made. The index build's encoder actors count passages per encoder call (:class:`TalliedEncoder`), not when
a block is done, and the driver logs the count every 15 s (:func:`report_tally`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raypipe.core.progress import HEARTBEAT_S, Heartbeat, Progress
from raypipe.retrieval.encoders import Encoder


class Tally:
    def __init__(self) -> None:
        self.count = 0

    def add(self, n: int) -> None:
        self.count += n

    def read(self) -> int:
        return self.count


def start_tally() -> Any:
    """A :class:`Tally` actor holding no CPU (its handle travels to the workers; ``ray.kill`` it after)."""
    import ray

    return ray.remote(Tally).options(num_cpus=0).remote()


def report_tally(tally: Any, progress: Progress, every_s: float = HEARTBEAT_S) -> Heartbeat:
    """The thread that logs ``progress`` at the tally actor's count every ``every_s`` seconds (a ``with``
    block); a rerun piece of work (its worker died) counts twice, so the line says at most the total."""
    import ray

    def beat() -> None:
        count = ray.get(tally.read.remote(), timeout=10)
        progress.done = count if progress.total is None else min(progress.total, count)
        progress.advance(0)

    return Heartbeat(beat, every_s, name="raypipe-tally-progress")


class TalliedEncoder:
    """An encoder that adds the passages of each call to a :class:`Tally` actor."""

    def __init__(self, encoder: Encoder, tally: Any):
        self.encoder, self.tally = encoder, tally

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.encode_queries(texts)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.encoder.encode_passages(texts)
        self.tally.add.remote(len(texts))  # not awaited: the count is for the progress line only
        return vectors
