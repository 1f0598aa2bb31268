"""The document store (row id -> doc_id, title, text) and corpus statistics for QPP.

The statistics are document frequencies in two lexicons, each over the passage's title + " " + text:

- ``plain``: lowercase Unicode word tokens (``\\w+``), no stemming, no stopword list (``features.nqc_idf=true``
  looks query tokens up here, tokenised by :func:`tokenize`);
- ``terrier``: the terms Terrier's default English indexing stores (:mod:`raypipe.retrieval.terrier`:
  ASCII alphanumeric tokens, lowercased, Terrier's stopwords removed, Porter stems): the seed's lexicon,
  where its NQC looks Porter stems of whitespace tokens up (``features.nqc_idf=seed``).

``df(term)`` is the number of passages containing the term at least once and ``N`` the passage count;
``idf(term) = log(N / df)``. A built index keeps one sorted, memory-mapped table per lexicon
(``df_plain.arrow``, ``df_terrier.arrow``; :mod:`raypipe.retrieval.termtable`); indexes written before
them have only ``corpus_stats.parquet`` (plain, read into memory) until ``raypipe index`` adds them.

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
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypipe.data.loaders import DataError, Passage, iter_corpus
from raypipe.retrieval import terrier
from raypipe.retrieval.termtable import TermTable, write_terms

_TOKEN = re.compile(r"\w+")

DOCSTORE_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
LEXICONS = ("plain", "terrier")
LEXICON_FILES = {lexicon: f"df_{lexicon}.arrow" for lexicon in LEXICONS}
LEGACY_STATS_FILE = "corpus_stats.parquet"  # the plain lexicon of indexes written before LEXICON_FILES
TOKENISATION = {
    "plain": "lowercase \\w+ over title + ' ' + text",
    "terrier": "Terrier EnglishTokeniser + stopword-list.txt + PorterStemmer over title + ' ' + text",
}
BLOCK_DF_SCHEMA = pa.schema([("lexicon", pa.string()), ("term", pa.string()), ("df", pa.int64())])


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens, the tokenisation of the ``plain`` lexicon."""
    return _TOKEN.findall(text.lower())


_LEXICON_TERMS = {"plain": lambda text: set(tokenize(text)), "terrier": terrier.index_terms}


def passage_terms(title: str, text: str, lexicon: str = "plain") -> set[str]:
    """The distinct terms of a passage in ``lexicon``."""
    return _LEXICON_TERMS[lexicon](f"{title} {text}")


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
    def read(cls, path: str | Path, doc_rows: str | Path | None = None) -> DocStore:
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
        return table_passages(self.table.take(pa.array(ids, type=pa.int64())))

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


def table_passages(table: pa.Table | pa.RecordBatch) -> list[Passage]:
    """The passages of doc-store rows, in order."""
    columns = (table.column(name).to_pylist() for name in ("doc_id", "title", "text"))
    return [Passage(doc_id=d, title=t, text=x) for d, t, x in zip(*columns)]


def check_unique_ids(doc_rows: np.ndarray, doc_id_at) -> None:
    """Raise DataError naming a passage id that occurs twice (``doc_id_at(row)`` -> id)."""
    hashes = doc_rows[:, 0]
    for at in np.flatnonzero(hashes[1:] == hashes[:-1]):
        first, second = int(doc_rows[at, 1]), int(doc_rows[at + 1, 1])
        if doc_id_at(first) == doc_id_at(second):
            raise DataError(
                f"duplicate passage id {doc_id_at(first)!r} (corpus rows {min(first, second)} and {max(first, second)})"
            )


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
    """(lexicon, term, df) over some passages in every lexicon, and their count: one build block's share
    of the statistics."""
    counts = {lexicon: Counter() for lexicon in LEXICONS}
    n = 0
    for p in passages:
        for lexicon, counter in counts.items():
            counter.update(passage_terms(p.title, p.text, lexicon))
        n += 1
    columns = {
        "lexicon": [lexicon for lexicon, counter in counts.items() for _ in range(len(counter))],
        "term": [term for counter in counts.values() for term in counter],
        "df": [df for counter in counts.values() for df in counter.values()],
    }
    return pa.table(columns, schema=BLOCK_DF_SCHEMA), n


class FrequencyMerger:
    """Sums per-block (lexicon, term, df) tables in Arrow, folding them together every ``fold_every``
    blocks, so memory holds the merged vocabularies plus a few blocks' terms (not a dict of every term)."""

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
        merged = pa.concat_tables(self._parts).group_by(["lexicon", "term"]).aggregate([("df", "sum")])
        return merged.select(["lexicon", "term", "df_sum"]).rename_columns(BLOCK_DF_SCHEMA.names).cast(BLOCK_DF_SCHEMA)

    def tables(self, lexicons: Sequence[str] = LEXICONS) -> Iterator[tuple[str, pa.Table]]:
        """Each lexicon's (term, df) table, sorted by term, with its metadata (n_docs, tokenisation)."""
        merged = self._fold() if self._parts else BLOCK_DF_SCHEMA.empty_table()
        for lexicon in lexicons:
            table = merged.filter(pc.equal(merged.column("lexicon"), lexicon)).select(["term", "df"]).sort_by("term")
            yield lexicon, table.replace_schema_metadata(_stats_metadata(lexicon, self.n_docs))

    def write(self, directory: str | Path, lexicons: Sequence[str] = LEXICONS) -> dict[str, int]:
        """Write each lexicon's table into ``directory`` (``LEXICON_FILES``); returns their term counts."""
        sizes = {}
        for lexicon, table in self.tables(lexicons):
            write_terms(table, Path(directory) / LEXICON_FILES[lexicon])
            sizes[lexicon] = table.num_rows
        return sizes


def _stats_metadata(lexicon: str, n_docs: int) -> dict[str, str]:
    return {"n_docs": str(n_docs), "lexicon": lexicon, "tokenisation": TOKENISATION[lexicon]}


class MissingLexiconError(LookupError):
    """The index has no table for a lexicon (written before it existed)."""


class CorpusStats:
    """Document frequencies over the corpus in each lexicon (see the module docstring)."""

    def __init__(self, tables: Mapping[str, TermTable], n_docs: int, where: str = "the corpus statistics"):
        self.tables = dict(tables)
        self.n_docs = n_docs
        self.where = where

    @classmethod
    def count(cls, passages: Iterable[Passage]) -> CorpusStats:
        """Both lexicons counted in memory (small corpora, tests)."""
        merger = FrequencyMerger()
        merger.add(*document_frequencies(passages))
        return cls({lexicon: TermTable(table) for lexicon, table in merger.tables()}, merger.n_docs)

    @classmethod
    def read(cls, directory: str | Path) -> CorpusStats:
        """Map the lexicons' tables of an index directory (``plain`` from ``corpus_stats.parquet`` in
        indexes written before the mapped tables); a lexicon without a table raises on lookup."""
        directory = Path(directory)
        tables: dict[str, TermTable] = {}
        for lexicon, name in LEXICON_FILES.items():
            if (directory / name).exists():
                tables[lexicon] = TermTable.read(directory / name)
            elif lexicon == "plain" and (directory / LEGACY_STATS_FILE).exists():
                tables[lexicon] = TermTable(pq.read_table(directory / LEGACY_STATS_FILE))  # written sorted by term
        n_docs = {table.metadata.get("n_docs") for table in tables.values()}
        if not tables or None in n_docs or len(n_docs) > 1:
            raise ValueError(
                f"{directory}: corpus statistics missing or without one n_docs ({sorted(map(str, n_docs))})"
            )
        return cls(tables, int(n_docs.pop()), str(directory))

    def df(self, term: str, lexicon: str = "plain") -> int:
        """Passages containing ``term`` (already normalised for ``lexicon``: "plain" or "terrier"); 0 if
        unseen. MissingLexiconError if this index has no table for the lexicon."""
        table = self.tables.get(lexicon)
        if table is None:
            if lexicon not in LEXICONS:
                raise ValueError(f"unknown lexicon {lexicon!r}; use one of {LEXICONS}")
            raise MissingLexiconError(
                f"{self.where} has no {lexicon!r} document frequencies ({LEXICON_FILES[lexicon]}): the index "
                "was built before they were written. Run `raypipe index` with this run's configuration to add "
                "them from its doc store (nothing is re-encoded)"
            )
        return table.get(term)

    def document_frequencies(self, terms: Sequence[str], lexicon: str = "plain") -> list[int]:
        """:meth:`df` of each term, in order."""
        return [self.df(t, lexicon) for t in terms]

    def idf(self, term: str) -> float | None:
        """log(N / df) in the plain lexicon; None for a term that occurs in no passage (callers skip it)."""
        df = self.df(term)
        return math.log(self.n_docs / df) if df else None

    def max_idf(self, text: str) -> float:
        """Largest IDF over the text's tokens that occur in the corpus; 0.0 if none does."""
        idfs = [v for v in (self.idf(t) for t in tokenize(text)) if v is not None]
        return max(idfs, default=0.0)
