"""Document texts for the intra-iteration relation: the run's retrieval index, else its corpus file."""

from __future__ import annotations

import logging

from raypipe.core.config import RunConfig
from raypipe.predict.relations import DocLookup

log = logging.getLogger(__name__)


def doc_lookup_for(config: RunConfig) -> DocLookup:
    """doc_id -> (title, text) from the index's doc store when it is built, else from the corpus jsonl."""
    from raypipe.retrieval.build import corpus_path, index_dir_for
    from raypipe.retrieval.index import MANIFEST, load_index_dir
    from raypipe.retrieval.store import corpus_documents

    folder = index_dir_for(config)
    if (folder / MANIFEST).exists():
        docs = load_index_dir(folder).docs
        log.info("document texts from the index doc store %s", folder)

        def from_store(doc_id: str) -> tuple[str, str] | None:
            try:
                (passage,) = docs.by_id([doc_id])
            except KeyError:
                return None
            return passage.title, passage.text

        return from_store
    path = corpus_path(config.data)
    log.info("document texts from the corpus file %s (no index doc store at %s)", path, folder)
    return corpus_documents(path).get
