"""Bounded memories in front of the encoders and the index, for the online controller.

The controller extracts a trajectory's signals after every iteration over its whole history (the
inter-iteration signals look backwards), so without a memory each decision would encode the question,
every query and every reasoning again, fetch every document vector again and search the question again.
Behind these wrappers a decision sends the encoders and the index only what the trajectory's last
iteration added; the signals themselves are cheap arithmetic over the memorised vectors and lists.
Each memory keeps its most recently used ``capacity`` entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from raypipe.features.resources import CorpusResources, SentenceEncoder

CAPACITY = 20_000  # entries per memory: a few thousand trajectories' texts, vectors and lists


class _Memory:
    """The most recently used ``capacity`` results of a batched function, by key."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get_many(self, keys: Sequence[Hashable], compute: Callable[[list[Hashable]], Sequence[Any]]) -> list[Any]:
        missing = list(dict.fromkeys(k for k in keys if k not in self._items))
        if missing:
            self._items.update(zip(missing, compute(missing)))
        found = []
        for key in keys:
            self._items.move_to_end(key)
            found.append(self._items[key])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return found


class MemoSentences:
    """A :class:`SentenceEncoder` that encodes each text once."""

    def __init__(self, inner: SentenceEncoder, capacity: int = CAPACITY):
        self.inner, self._vectors = inner, _Memory(capacity)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack(self._vectors.get_many(list(texts), lambda missing: list(self.inner.encode(missing))))


class MemoCorpus:
    """A :class:`CorpusResources` that fetches each document vector, encodes each query and runs each search
    once (statistics pass through: they are lookups already)."""

    def __init__(self, inner: CorpusResources, capacity: int = CAPACITY):
        self.inner = inner
        self.num_docs = inner.num_docs
        self._docs, self._queries, self._lists = _Memory(capacity), _Memory(capacity), _Memory(capacity)

    def terms(self, text: str) -> list[str]:
        return self.inner.terms(text)

    def document_frequency(self, term: str, lexicon: str = "plain") -> int:
        return self.inner.document_frequency(term, lexicon)

    def doc_vectors(self, doc_ids: Sequence[str]) -> np.ndarray:
        return np.stack(self._docs.get_many(list(doc_ids), lambda missing: list(self.inner.doc_vectors(missing))))

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack(self._queries.get_many(list(texts), lambda missing: list(self.inner.encode_queries(missing))))

    def search(self, texts: Sequence[str], k: int) -> list[list[str]]:
        keys = [(t, k) for t in texts]
        return self._lists.get_many(keys, lambda missing: self.inner.search([t for t, _ in missing], k))
