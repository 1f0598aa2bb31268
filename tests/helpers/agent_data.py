"""What supervised agent trajectories are built with in tests: the embedded preset's retriever over its index
(built in this process if missing) and its model's tokenizer."""

from __future__ import annotations

from raypipe.core.config import RunConfig
from raypipe.core.models import resolve_llm
from raypipe.llm.common import LocalTokenizer


def retriever_and_tokenizer(config: RunConfig):
    from raypipe.retrieval import LocalRetriever, encoder_spec, search_params
    from raypipe.runtime.index_build import ensure_index

    retriever = LocalRetriever.open(
        ensure_index(config, use_ray=False), encoder_spec(config.retrieval), search_params(config.retrieval)
    )
    return retriever, LocalTokenizer(resolve_llm(config.engine.model))
