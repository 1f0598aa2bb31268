"""The document store (row id -> doc_id, title, text) and corpus statistics for QPP.

Tokenisation for the statistics (documented, so features compute the same thing): lowercase the
passage's title + " " + text and take Unicode word tokens (``\\w+``); no stemming, no stopword list.
``df(term)`` is the number of passages containing the term at least once and ``N`` the passage count;
``idf(term) = log(N / df)``.

A built index keeps its doc store as an Arrow IPC file (``docs.arrow``, one record batch per build
block), which :meth:`DocStore.read` maps from disk without copying, so replicas and stages on one node
share its pages; passage ids are found through a sorted table of 64-bit id hashes (``doc_rows.npy``,
also mapped) instead of a dict over every id. Indexes written before keep ``docs.parquet`` (read whole).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypipe.data.loaders import DataError, Passage, iter_corpus

_TOKEN = re.compile(r"\w+")

DOCSTORE_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
STATS_SCHEMA = pa.schema([("term", pa.string()), ("df", pa.int64())])


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens, the tokenisation of the corpus statistics."""
    return _TOKEN.findall(text.lower())


def passage_terms(title: str, text: str) -> set[str]:
    return set(tokenize(f"{title} {text}"))


def doc_id_hashes(doc_ids: Sequence[str]) -> np.ndarray:
    """64-bit hashes of passage ids (blake2b, the same in every process)."""
    return np.frombuffer(
        b"".join(hashlib.blake2b(d.encode("utf-8"), digest_size=8).digest() for d in doc_ids), dtype="<u8"
    ).copy()


def sorted_doc_rows(hashes: np.ndarray) -> np.ndarray:
    """``(N, 2)`` uint64 array of (id hash, row) sorted by hash: the doc store's id lookup table."""
    order = np.argsort(hashes, kind="stable")
    return np.stack([hashes[order], order.astype(np.uint64)], axis=1)


class DocStore:
    """Passages by FAISS row id, in a table whose row order is the FAISS id order.

    ``doc_rows`` (see :func:`sorted_doc_rows`) finds a passage id's row by binary search; without it a
    dict over all ids is built on first use (small or older indexes)."""

    def __init__(self, table: pa.Table, doc_rows: np.ndarray | None = None):
        if table.schema.names[:3] != ["doc_id", "title", "text"]:
            raise ValueError(f"doc store columns must be doc_id, title, text; got {table.schema.names}")
        self.table = table
        self._doc_rows = doc_rows
        self._row_of: dict[str, int] | None = None

    @classmethod
    def read(cls, path: str | Path, doc_rows: str | Path | None = None) -> "DocStore":
        """An Arrow IPC file (``.arrow``) is memory-mapped, a Parquet file read into memory."""
        path = Path(path)
        rows = np.load(doc_rows, mmap_mode="r") if doc_rows is not None and Path(doc_rows).exists() else None
        if path.suffix == ".arrow":
            return cls(pa.ipc.open_file(pa.memory_map(str(path))).read_all(), rows)
        return cls(pq.read_table(path).combine_chunks(), rows)

    @staticmethod
    def write(passages: Iterable[Passage], path: str | Path) -> int:
        table = passages_table(list(passages))
        pq.write_table(table, path)
        return table.num_rows

    def __len__(self) -> int:
        return self.table.num_rows

    def get(self, ids: Sequence[int]) -> list[Passage]:
        """Passages for FAISS row ids, in the given order."""
        if not len(ids):
            return []
        taken = self.table.take(pa.array(ids, type=pa.int64()))
        return [
            Passage(doc_id=d, title=t, text=x)
            for d, t, x in zip(
                taken.column("doc_id").to_pylist(), taken.column("title").to_pylist(), taken.column("text").to_pylist()
            )
        ]

    def row_of(self, doc_id: str) -> int:
        """The FAISS row id of a passage id (KeyError if unknown)."""
        return self.rows_of([doc_id])[0]

    def rows_of(self, doc_ids: Sequence[str]) -> list[int]:
        """FAISS row ids of passage ids, in order (KeyError naming the first unknown one)."""
        if self._doc_rows is None:
            if self._row_of is None:
                self._row_of = {d: i for i, d in enumerate(self.table.column("doc_id").to_pylist())}
            return [self._row_of[d] for d in doc_ids]
        hashes = self._doc_rows[:, 0]
        wanted = doc_id_hashes(doc_ids)
        rows = []
        for doc_id, h, at in zip(doc_ids, wanted, np.searchsorted(hashes, wanted)):
            found = None
            while at < len(hashes) and hashes[at] == h:  # equal hashes: compare the ids themselves
                row = int(self._doc_rows[at, 1])
                if self.table.column("doc_id")[row].as_py() == doc_id:
                    found = row
                    break
                at += 1
            if found is None:
                raise KeyError(doc_id)
            rows.append(found)
        return rows

    def by_id(self, doc_ids: Sequence[str]) -> list[Passage]:
        """Passages for passage ids, in the given order (KeyError if one is unknown)."""
        return self.get(self.rows_of(doc_ids))


def passages_table(passages: Sequence[Passage]) -> pa.Table:
    return pa.table(
        {
            "doc_id": [p.doc_id for p in passages],
            "title": [p.title for p in passages],
            "text": [p.text for p in passages],
        },
        schema=DOCSTORE_SCHEMA,
    )


def check_unique_ids(doc_rows: np.ndarray, doc_id_at) -> None:
    """Raise DataError naming a passage id that occurs twice (``doc_id_at(row)`` -> id)."""
    hashes = doc_rows[:, 0]
    for at in np.flatnonzero(hashes[1:] == hashes[:-1]):
        first, second = int(doc_rows[at, 1]), int(doc_rows[at + 1, 1])
        if doc_id_at(first) == doc_id_at(second):
            raise DataError(f"duplicate passage id {doc_id_at(first)!r} (corpus rows {min(first, second)} and {max(first, second)})")


def corpus_documents(path: str | Path, wanted: Collection[str] | None = None) -> dict[str, tuple[str, str]]:
    """doc_id -> (title, text) streamed from a corpus jsonl: every passage, or only the ``wanted`` ids
    (the scan stops once all of them are found)."""
    docs: dict[str, tuple[str, str]] = {}
    for passage in iter_corpus(path):
        if wanted is None or passage.doc_id in wanted:
            docs[passage.doc_id] = (passage.title, passage.text)
            if wanted is not None and len(docs) == len(wanted):
                break
    return docs


def document_frequencies(passages: Iterable[Passage]) -> tuple[pa.Table, int]:
    """(term, df) over some passages, and their count: one build block's share of the statistics."""
    stats = CorpusStats.count(passages)
    terms = list(stats.df_table)
    return pa.table({"term": terms, "df": [stats.df_table[t] for t in terms]}, schema=STATS_SCHEMA), stats.n_docs


class FrequencyMerger:
    """Sums per-block (term, df) tables in Arrow, folding them together every ``fold_every`` blocks, so
    memory holds the merged vocabulary plus a few blocks' terms (not a Python dict of every term)."""

    def __init__(self, fold_every: int = 16):
        self.fold_every = fold_every
        self._parts: list[pa.Table] = []
        self.n_docs = 0

    def add(self, table: pa.Table, n_docs: int) -> None:
        self._parts.append(table)
        self.n_docs += n_docs
        if len(self._parts) >= self.fold_every:
            self._parts = [self._fold()]

    def _fold(self) -> pa.Table:
        merged = pa.concat_tables(self._parts).group_by("term").aggregate([("df", "sum")])
        return merged.rename_columns(["term", "df"]).cast(STATS_SCHEMA)

    def write(self, path: str | Path) -> int:
        """Write the statistics file (sorted by term, as :meth:`CorpusStats.write`); returns the term count."""
        table = self._fold().sort_by("term") if self._parts else STATS_SCHEMA.empty_table()
        pq.write_table(table.replace_schema_metadata(_stats_metadata(self.n_docs)), path)
        return table.num_rows


def _stats_metadata(n_docs: int) -> dict[str, str]:
    return {"n_docs": str(n_docs), "tokenisation": "lowercase \\w+"}


class CorpusStats:
    """Document frequencies over the corpus (see the module docstring for the tokenisation)."""

    def __init__(self, df: dict[str, int], n_docs: int):
        self.df_table = df
        self.n_docs = n_docs

    @classmethod
    def count(cls, passages: Iterable[Passage]) -> "CorpusStats":
        counts: Counter[str] = Counter()
        n = 0
        for p in passages:
            counts.update(passage_terms(p.title, p.text))
            n += 1
        return cls(dict(counts), n)

    def write(self, path: str | Path) -> None:
        terms = sorted(self.df_table)
        table = pa.table({"term": terms, "df": [self.df_table[t] for t in terms]}, schema=STATS_SCHEMA)
        pq.write_table(table.replace_schema_metadata(_stats_metadata(self.n_docs)), path)

    @classmethod
    def read(cls, path: str | Path) -> "CorpusStats":
        table = pq.read_table(path)
        meta = table.schema.metadata or {}
        if b"n_docs" not in meta:
            raise ValueError(f"{path}: corpus statistics without n_docs metadata")
        df = dict(zip(table.column("term").to_pylist(), table.column("df").to_pylist()))
        return cls(df, int(meta[b"n_docs"]))

    def df(self, term: str) -> int:
        """Passages containing ``term`` (already lowercased/tokenised); 0 if unseen."""
        return self.df_table.get(term, 0)

    def idf(self, term: str) -> float | None:
        """log(N / df); None for a term that occurs in no passage (callers skip it, as Terrier does)."""
        df = self.df(term)
        return math.log(self.n_docs / df) if df else None

    def max_idf(self, text: str) -> float:
        """Largest IDF over the text's tokens that occur in the corpus; 0.0 if none does."""
        idfs = [v for v in (self.idf(t) for t in tokenize(text)) if v is not None]
        return max(idfs, default=0.0)
