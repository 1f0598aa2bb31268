"""Small corpora cut from the bundled one, indexed in seconds."""

from __future__ import annotations

import json
from pathlib import Path

from raypipe.data.loaders import BUNDLED_CORPUS, load_questions


def paragraph_corpus(path: Path, datasets: tuple[str, ...], limit: int) -> Path:
    """A corpus of just the paragraphs of the first ``limit`` questions of ``datasets``, written to ``path``."""
    wanted = {pid for d in datasets for q in load_questions(d, limit=limit) for pid in q.extra["paragraph_ids"]}
    with BUNDLED_CORPUS.open() as src, path.open("w") as dst:
        dst.writelines(line for line in src if json.loads(line)["id"] in wanted)
    return path
