"""Keys renamed or moved since runs were written, read under their new names.

A run directory keeps the ``config.yaml`` it was made with; a later stage, a resume or the report reads it through
:func:`migrate_tree`, so a run written before a key moved (``retrieval.nprobe`` before ``retrieval.index.nprobe``)
still loads, with the same values. A ``--set`` naming an old key is read as the new one (:func:`migrate_key`), with
a warning that names it.
"""

from __future__ import annotations

import logging
from typing import Any

from raypipe.core.config.base import ConfigError

log = logging.getLogger(__name__)

_RETRIEVAL_SUBSECTIONS = {
    "index": {
        "index_type": "type",
        "fp16": "fp16",
        "ivf_nlist": "ivf_nlist",
        "pq_m": "pq_m",
        "pq_nbits": "pq_nbits",
        "hnsw_m": "hnsw_m",
        "nprobe": "nprobe",
        "hnsw_ef_search": "hnsw_ef_search",
        "faiss_gpu": "faiss_gpu",
        "index_dir": "dir",
        "mmap": "mmap",
    },
    "encode": {
        "encode_actors": "actors",
        "encode_batch_size": "batch_size",
        "encode_num_cpus": "num_cpus",
        "encode_num_gpus": "num_gpus",
        "encode_threads": "threads",
        "build_block_rows": "block_rows",
        "read_num_cpus": "read_num_cpus",
        "shipped_vectors": "shipped_vectors",
    },
    "actors": {
        key: key
        for key in (
            "replicas",
            "num_cpus",
            "num_gpus",
            "resources",
            "search_threads",
            "max_batch_size",
            "max_wait_ms",
            "max_restarts",
            "max_task_retries",
            "max_query_crashes",
        )
    },
    "http": {
        "url": "url",
        "http_timeout_s": "timeout_s",
        "http_retries": "retries",
        "http_max_response_bytes": "max_response_bytes",
    },
    "serve": {
        "deployment": "deployment",
        "serve_max_queries": "max_queries",
        "serve_max_topk": "max_topk",
        "serve_max_results": "max_results",
        "serve_max_batch_results": "max_batch_results",
        "serve_max_items": "max_items",
        "serve_max_body_bytes": "max_body_bytes",
        "serve_timeout_s": "timeout_s",
    },
}

# section -> old key -> its new path inside the section (dotted: a sub-section's key)
MOVED_KEYS: dict[str, dict[str, str]] = {
    "stoprag": {"workers": "num_workers", "worker_num_cpus": "cpus_per_worker"},
    "retrieval": {old: f"{sub}.{new}" for sub, keys in _RETRIEVAL_SUBSECTIONS.items() for old, new in keys.items()},
}


def migrate_key(key: str) -> str:
    """A dotted key (``--set`` style) under its current name: ``retrieval.nprobe`` -> ``retrieval.index.nprobe``."""
    section, _, rest = key.partition(".")
    new = MOVED_KEYS.get(section, {}).get(rest)
    if new is None:
        return key
    log.warning("config key %s is now %s.%s; read as such", key, section, new)
    return f"{section}.{new}"


def migrate_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` (a config file's mapping) with every old key moved to its new place; the input is not changed.
    An old key beside its new one with another value is an error (which one was meant cannot be told)."""
    out = dict(tree)
    for section, moves in MOVED_KEYS.items():
        values = out.get(section)
        if not isinstance(values, dict) or not moves.keys() & values.keys():
            continue
        moved = {key: value for key, value in values.items() if key not in moves}
        for old, new in moves.items():
            if old in values:
                _place(moved, section, old, new, values[old])
        out[section] = moved
    return out


def _place(values: dict[str, Any], section: str, old: str, new: str, value: Any) -> None:
    *parents, last = new.split(".")
    node = values
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{section}.{part} must be a section (it holds {section}.{old}), got {child!r}")
        else:
            child = node[part] = dict(child)
        node = child
    if last in node and node[last] != value:
        raise ConfigError(
            f"{section}.{old}={value!r} and {section}.{new}={node[last]!r} are both set: "
            f"{section}.{old} is the old name of {section}.{new}; keep one"
        )
    node[last] = value
