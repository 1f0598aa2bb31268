"""A package facade whose names load on first use (PEP 562), so importing one of its modules does not import
them all: the GPU check (scripts/gpu_check.py) imports the encoder and the Stop-RAG network without Arrow,
FAISS or Ray."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: dict[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names are ``exports`` (module -> names in it);
    ``namespace``: the package's globals, where a loaded name is kept."""
    where = {name: module for module, names in exports.items() for name in names}

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(import_module(f"{package}.{where[name]}"), name)
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *where})

    return getattr_, dir_
