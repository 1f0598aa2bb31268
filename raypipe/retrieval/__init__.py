"""E5-style dense retrieval over FAISS: encoders, index build/load, and the retrieval service.

Agents (the ``Retriever`` protocol, :mod:`raypipe.retrieval.types`)::

    init_ray(config)                                                # raypipe.runtime.cluster: the job owns Ray
    client = start_retrieval_service(config, ensure_index(config))  # raypipe.runtime.retrieval / .index_build
    results = await client.search(["who wrote ..."], k=config.retrieval.deep_k)
    results[0].hits[:3]                             # SearchHit(doc_id, score, title, text), best first

The client is picklable: pass it to Ray actors and tasks. ``LocalRetriever.open(path, spec)`` is the same
search in-process, without Ray (tests, baselines).

Index directory (``jobs/index.py`` builds it; default ``$RAYPIPE_CACHE/indexes/<corpus sha256[:12]>-
<encoder>-<type>[-fp16]``, or ``retrieval.index.dir``)::

    manifest.json         encoder, encoder_path, query_prefix, passage_prefix, max_length, dimension,
                          count, corpus, corpus_sha256, index_type, fp16, factory, n_docs, created
    index.faiss           FAISS inner-product index over L2-normalised vectors; id i = row i of docs
    docs.arrow            doc_id, title, text (Arrow IPC, memory-mapped; docs.parquet in older indexes)
    doc_rows.npy          sorted (passage id hash, row): the id lookup
    df_plain.arrow        term, df sorted by term (memory-mapped); metadata n_docs. Lowercase ``\\w+`` tokens
                          of title + " " + text, no stemming or stopwords (older indexes: corpus_stats.parquet)
    df_terrier.arrow      the same for the terms Terrier's default English indexing stores (the seed's
                          NQC lexicon; raypipe.retrieval.terrier)

Readers (stable names)::

    idx = load_index_dir(path)            # IndexDir: .manifest, .docs, .stats, .vectors(rows)
    idx.docs.get([row, ...])              # DocStore -> [Passage(doc_id, title, text)]
    idx.docs.row_of(doc_id)               # FAISS row id of a passage
    idx.stats.df(term, lexicon="plain")   # CorpusStats; lexicon "plain" or "terrier"
    idx.stats.idf(term)                   # log(N/df) in the plain lexicon, None for unseen terms
    idx.stats.max_idf(text)               # max IDF over the text's tokens (0.0 if none is known)
    tokenize(text)                        # the plain lexicon's tokenisation
    index_dir_for(config)                 # where the configured index lives
    encoder_spec(config.retrieval).load() # the query/passage encoder (encode_queries/encode_passages)

Build from a corpus in resumable blocks (``raypipe.retrieval.build``), or import an existing FAISS
index without re-encoding (``raypipe.retrieval.import_faiss``, ``raypipe index --import-faiss``).

Errors: :class:`IndexNotFoundError` (missing directory or files), :class:`IndexMismatchError` (index built
with another encoder, dimension or build setting), raised before any model or index is loaded.
"""

from raypipe.core.lazy import lazy_exports

# Each name loads from its module on first use: a process that needs one module (the GPU check: encoders,
# gpu_memory) does not load Arrow, FAISS and the searcher with the package.
__getattr__, __dir__ = lazy_exports(
    __name__,
    globals(),
    {
        "batcher": ("QueryBatcher",),
        "build": ("encoder_spec", "index_dir_for", "index_settings", "search_params"),
        "encoders": ("Encoder", "EncoderSpec", "passage_text"),
        "index": (
            "IndexDir",
            "IndexMismatchError",
            "IndexNotFoundError",
            "IndexSettings",
            "SearchParams",
            "load_index_dir",
        ),
        "searcher": ("LocalRetriever",),
        "store": ("CorpusStats", "DocStore", "tokenize"),
        "types": ("Retriever", "SearchHit", "SearchResult"),
    },
)

__all__ = [
    "CorpusStats",
    "DocStore",
    "Encoder",
    "EncoderSpec",
    "IndexDir",
    "IndexMismatchError",
    "IndexNotFoundError",
    "IndexSettings",
    "LocalRetriever",
    "QueryBatcher",
    "Retriever",
    "SearchHit",
    "SearchParams",
    "SearchResult",
    "encoder_spec",
    "index_dir_for",
    "index_settings",
    "load_index_dir",
    "passage_text",
    "search_params",
    "tokenize",
]
