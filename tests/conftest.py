import os
from pathlib import Path

import pytest

# Tests run offline; converted models, indexes and compile caches go where every entry point puts them
# (raypipe.core.models.cache_dir: $RAYPIPE_CACHE if set, else ~/.cache/raypipe).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def write_jsonl(tmp_path):
    """Write raw lines (str or bytes) to a file and return its path."""

    def _write(lines, name="data.jsonl"):
        path = tmp_path / name
        with path.open("wb") as fh:
            for line in lines:
                fh.write(line if isinstance(line, bytes) else line.encode("utf-8"))
                fh.write(b"\n")
        return path

    return _write


@pytest.fixture(scope="session")
def paragraph_corpus(tmp_path_factory):
    """``make(datasets, limit)``: a corpus of just the paragraphs of those questions (indexes in seconds)."""
    import json

    from raypipe.data.loaders import BUNDLED_CORPUS, load_questions

    def make(datasets: tuple[str, ...], limit: int) -> Path:
        wanted = {pid for d in datasets for q in load_questions(d, limit=limit) for pid in q.extra["paragraph_ids"]}
        path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
        with BUNDLED_CORPUS.open() as src, path.open("w") as dst:
            dst.writelines(line for line in src if json.loads(line)["id"] in wanted)
        return path

    return make
