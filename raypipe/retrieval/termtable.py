"""A sorted (term, df) table looked up by binary search, memory-mapped from an Arrow IPC file.

A replica looks up a few terms per query in a vocabulary of millions (wiki-18). Holding it as a Python
dict costs about 100 bytes per term in every process; mapped, the file's pages are shared by all
processes on a node and only the ~log2(V) pages a lookup touches are read. The lookup compares UTF-8
bytes, which orders as Arrow's ``sort_by`` and Python's ``sorted`` do (by code point).
"""

from __future__ import annotations

import bisect
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

TERMS_SCHEMA = pa.schema([("term", pa.string()), ("df", pa.int64())])


class _SortedTerms:
    """The term column as a sequence of ``bytes`` (what :func:`bisect.bisect_left` needs)."""

    def __init__(self, terms: pa.StringArray):
        self._offsets = np.frombuffer(terms.buffers()[1], dtype=np.int32)[terms.offset : terms.offset + len(terms) + 1]
        data = terms.buffers()[2]
        self._data = memoryview(data) if data is not None else memoryview(b"")
        self._n = len(terms)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        return self._data[int(self._offsets[i]) : int(self._offsets[i + 1])].tobytes()


class TermTable:
    """Document frequencies by term over a table sorted by term (``TERMS_SCHEMA``)."""

    def __init__(self, table: pa.Table):
        table = _conform(table)
        self.table = table
        self.metadata = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        self._terms = _SortedTerms(table.column("term").chunk(0) if table.num_rows else pa.array([], pa.string()))
        self._df = table.column("df").to_numpy() if table.num_rows else np.zeros(0, np.int64)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], metadata: Mapping[str, str] | None = None) -> TermTable:
        terms = sorted(counts)
        table = pa.table({"term": terms, "df": [counts[t] for t in terms]}, schema=TERMS_SCHEMA)
        return cls(table.replace_schema_metadata(dict(metadata or {})))

    @classmethod
    def read(cls, path: str | Path) -> TermTable:
        """Map an IPC file written by :meth:`write` (nothing is copied into the heap)."""
        return cls(pa.ipc.open_file(pa.memory_map(str(path))).read_all())

    def write(self, path: str | Path) -> None:
        write_terms(self.table, path)

    def __len__(self) -> int:
        return len(self._terms)

    def get(self, term: str) -> int:
        """The term's df; 0 if it is not in the table."""
        key = term.encode("utf-8")
        at = bisect.bisect_left(self._terms, key)
        return int(self._df[at]) if at < len(self._terms) and self._terms[at] == key else 0


def write_terms(table: pa.Table, path: str | Path) -> None:
    """Write a (term, df) table sorted by term, with its schema metadata, as one record batch (atomically)."""
    path = Path(path)
    table = _conform(table)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _conform(table: pa.Table) -> pa.Table:
    """``TERMS_SCHEMA`` columns in one chunk, keeping the schema metadata (no copy if already so)."""
    return table.select(["term", "df"]).cast(TERMS_SCHEMA.with_metadata(table.schema.metadata)).combine_chunks()
