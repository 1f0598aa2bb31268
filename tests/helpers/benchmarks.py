"""Importing a script of benchmarks/ (no package) in a test, with benchmarks/ importable for its sibling imports."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextmanager
def imported_benchmark(script: str) -> Iterator[ModuleType]:
    """``benchmarks/<script>.py`` as module ``benchmark_<script>`` (in ``sys.modules`` while open: dataclasses look
    their module up), removed again with benchmarks/ from ``sys.path`` on exit."""
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"benchmark_{script}", BENCHMARKS / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
        sys.path.remove(str(BENCHMARKS))
