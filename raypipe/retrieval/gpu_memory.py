"""GPU memory of a flat FAISS index cloned onto GPUs (faiss-gpu 1.15), as arithmetic: no faiss, no torch.

Read from faiss 1.15's sources (``faiss/gpu``):

- ``GpuIndexFlat::copyFrom`` (what ``index_cpu_to_gpu(s)``'s cloner calls) hands the whole CPU array to
  ``FlatIndex::add`` in one call. With a float16 store that copies all rows to the GPU in float32
  (``toDeviceTemporary``), converts them to a float16 temporary (``convertTensorTemporary``) and only then
  appends that to the store: rows x dim x (4 + 2 + 2) bytes at once, about 120 GiB for wiki-18's
  21,015,324 x 768 for a 30 GiB store.
- ``GpuIndexFlat::add`` on an empty index reserves the store for all its rows once, then pages them
  (``GpuIndex::addPaged_``: at most ``kAddPageSize`` = 256 MiB of float32 and ``kSearchVecSize`` = 32768 rows
  a page), each page through the same two temporaries, which fit in the temporary memory that
  ``StandardGpuResources`` reserves per GPU (1.5 GiB on cards over 8 GiB). After each page it recomputes the
  rows' norms (a new float32 array beside the old one). Separate ``add`` calls would not do: each appends
  with an exact reservation, re-allocating the store beside the old one (2x at the last block).

:func:`clone_events` lists one GPU's allocations in order for either way; :func:`peak_bytes` replays them.
``raypipe.retrieval.index.to_gpus`` builds by the paged add; ``scripts/gpu_check.py`` replays both with torch
allocations under memory caps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

GiB = 1024**3
ADD_PAGE_BYTES = 256 * 1024**2  # faiss/gpu/GpuIndex.cu kAddPageSize
ADD_PAGE_ROWS = 32 * 1024  # faiss/gpu/GpuIndex.cu kSearchVecSize (caps a page's rows)
ADD_VEC_ROWS = 512 * 1024  # faiss/gpu/GpuIndex.cu kAddVecSize: up to this many rows (and one page's bytes), one page
TEMP_MEMORY_BYTES = 1536 * 1024**2  # faiss/gpu/StandardGpuResources.cpp kMaxTempMem (cards over 8 GiB)
WIKI18_ROWS = 21_015_324  # Search-R1's wiki-18 corpus (e5-base-v2: 768 dimensions)

Method = Literal["copy", "paged"]


@dataclass(frozen=True)
class Event:
    """One allocation (``bytes`` > 0) or the release of an earlier one (``bytes`` == 0) named ``name``."""

    name: str
    bytes: int = 0


def page_rows(rows: int, dim: int) -> int:
    """Rows per page when ``GpuIndexFlat::add`` adds ``rows`` float32 vectors (``GpuIndex::addPaged_``)."""
    if rows <= ADD_VEC_ROWS and rows * dim * 4 <= ADD_PAGE_BYTES:
        return max(rows, 1)
    return max(1, min(ADD_PAGE_ROWS, ADD_PAGE_BYTES // (dim * 4)))


def clone_events(rows: int, dim: int, fp16: bool, method: Method) -> list[Event]:
    """One GPU's allocations, in order, while ``rows`` vectors of ``dim`` float32 become a flat GPU index
    (``fp16``: a float16 store). ``copy``: faiss's cloner (one call); ``paged``: an empty index's ``add``."""
    value = 2 if fp16 else 4
    events = [Event("temporary memory", TEMP_MEMORY_BYTES)]
    if method == "copy":
        if fp16:
            events += [
                Event("float32 rows", rows * dim * 4),
                Event("float16 rows", rows * dim * 2),
                Event("store", rows * dim * value),
                Event("float16 rows"),
                Event("float32 rows"),
            ]
        else:
            events.append(Event("store", rows * dim * value))  # appended straight from the host array
        events.append(Event("norms", rows * 4))
        return events
    events.append(Event("store", rows * dim * value))  # reserved once for every row
    step = page_rows(rows, dim) if fp16 else max(rows, 1)  # a float32 store appends from the host without paging
    own = fp16 and step * dim * 6 > TEMP_MEMORY_BYTES  # page temporaries outside the reserved temporary memory
    added, norms = 0, None
    while added < rows:
        n = min(step, rows - added)
        if own:
            events += [
                Event("page float32", n * dim * 4),
                Event("page float16", n * dim * 2),
                Event("page float16"),
                Event("page float32"),
            ]
        added += n
        name = f"norms {added}"
        events.append(Event(name, added * 4))  # the new norms beside the previous page's
        if norms:
            events.append(Event(norms))
        norms = name
    return events


def peak_bytes(events: list[Event]) -> int:
    """The most bytes held at once while the events run."""
    held: dict[str, int] = {}
    peak = 0
    for event in events:
        if event.bytes:
            held[event.name] = event.bytes
            peak = max(peak, sum(held.values()))
        else:
            held.pop(event.name)
    return peak


@dataclass(frozen=True)
class GpuClonePlan:
    """What one GPU of a flat index's clone holds: ``rows`` of ``count`` vectors (all when replicated)."""

    count: int
    dim: int
    gpus: int
    shard: bool
    fp16: bool = True

    @property
    def rows(self) -> int:
        return math.ceil(self.count / self.gpus) if self.shard else self.count

    @property
    def store_bytes(self) -> int:
        return self.rows * self.dim * (2 if self.fp16 else 4)

    @property
    def peak_bytes(self) -> int:
        """The paged add's peak on one GPU (raypipe's clone)."""
        return peak_bytes(clone_events(self.rows, self.dim, self.fp16, "paged"))

    @property
    def mode(self) -> str:
        return f"{'shard' if self.shard else 'replicate'} over {self.gpus} GPU{'s' if self.gpus > 1 else ''}"


class GpuMemoryError(RuntimeError):
    """The index does not fit on the GPUs: raised before the index file is read."""


def check_gpu_memory(plan: GpuClonePlan, free: list[int], where: str = "the index") -> None:
    """Raise :class:`GpuMemoryError` (one line, with the numbers) if a GPU's free bytes cannot hold the peak."""
    short = [(i, f) for i, f in enumerate(free) if f < plan.peak_bytes]
    if not short:
        return
    gpu, have = short[0]
    raise GpuMemoryError(
        f"{where} ({plan.count:,} x {plan.dim} vectors, {'float16' if plan.fp16 else 'float32'} on the GPU, "
        f"{plan.mode}: {plan.rows:,} rows per GPU) needs {plan.peak_bytes / 1e9:.1f} GB on each GPU at its peak "
        f"(store {plan.store_bytes / 1e9:.1f} GB + norms + faiss's {TEMP_MEMORY_BYTES / GiB:.1f} GiB of temporary "
        f"memory), GPU {gpu} has {have / 1e9:.1f} GB free: give the retrieval actor more GPUs "
        "(retrieval.actors.num_gpus) with retrieval.index.faiss_gpu=shard, or use a larger card"
    )
