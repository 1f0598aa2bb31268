import os
from pathlib import Path

import pytest

# Tests run offline and keep converted models, indexes and compile caches inside the checkout.
ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAYPIPE_CACHE", str(ROOT / ".cache" / "raypipe"))
os.environ.setdefault("VLLM_CACHE_ROOT", str(ROOT / ".cache" / "vllm"))
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
