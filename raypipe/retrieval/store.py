"""The document store (row id -> doc_id, title, text) and corpus statistics for QPP.

Tokenisation for the statistics (documented, so features compute the same thing): lowercase the
passage's title + " " + text and take Unicode word tokens (``\\w+``); no stemming, no stopword list.
``df(term)`` is the number of passages containing the term at least once and ``N`` the passage count;
``idf(term) = log(N / df)``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from raypipe.data.loaders import Passage, iter_corpus

_TOKEN = re.compile(r"\w+")

DOCSTORE_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
STATS_SCHEMA = pa.schema([("term", pa.string()), ("df", pa.int64())])


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens, the tokenisation of the corpus statistics."""
    return _TOKEN.findall(text.lower())


def passage_terms(title: str, text: str) -> set[str]:
    return set(tokenize(f"{title} {text}"))


class DocStore:
    """Passages by FAISS row id; backed by a Parquet file whose row order is the FAISS id order."""

    def __init__(self, table: pa.Table):
        if table.schema.names[:3] != ["doc_id", "title", "text"]:
            raise ValueError(f"doc store columns must be doc_id, title, text; got {table.schema.names}")
        self.table = table.combine_chunks()
        self._row_of: dict[str, int] | None = None

    @classmethod
    def read(cls, path: str | Path) -> "DocStore":
        return cls(pq.read_table(path))

    @staticmethod
    def write(passages: Iterable[Passage], path: str | Path) -> int:
        rows = list(passages)
        table = pa.table(
            {
                "doc_id": [p.doc_id for p in rows],
                "title": [p.title for p in rows],
                "text": [p.text for p in rows],
            },
            schema=DOCSTORE_SCHEMA,
        )
        pq.write_table(table, path)
        return len(rows)

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
        if self._row_of is None:
            self._row_of = {d: i for i, d in enumerate(self.table.column("doc_id").to_pylist())}
        return self._row_of[doc_id]

    def by_id(self, doc_ids: Sequence[str]) -> list[Passage]:
        """Passages for passage ids, in the given order (KeyError if one is unknown)."""
        return self.get([self.row_of(d) for d in doc_ids])


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
        table = table.replace_schema_metadata({"n_docs": str(self.n_docs), "tokenisation": "lowercase \\w+"})
        pq.write_table(table, path)

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
