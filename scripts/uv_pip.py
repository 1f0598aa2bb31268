"""Run ``uv pip install`` with this machine's pip configuration.

uv reads neither pip.conf nor the PIP_* variables, so on its own it would miss what pip uses here: a local
wheel folder (find-links), no index at all (no-index, e.g. PIP_NO_INDEX=1 for an offline install from wheels),
extra indexes, pip-wide constraints, a CA bundle, a timeout. This reads pip's settings
(``pip config list``; the environment over the install section over the global one, as pip ranks them)
and passes them to uv. With extra indexes uv takes the best version across all of them, as pip does.

    python scripts/uv_pip.py UV_BINARY TARGET_PYTHON [uv pip install arguments ...]
"""

from __future__ import annotations

import os
import subprocess
import sys

RANKS = (":env:", "install", "global")
INDEX_FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url"}
LIST_FLAGS = {**INDEX_FLAGS, "find-links": "--find-links", "constraint": "--constraint"}
TRUE = ("1", "true", "yes", "on")  # pip's reading of a boolean setting


def is_set(settings: dict[str, str], name: str) -> bool:
    return settings.get(name, "").lower() in TRUE


def pip_settings() -> dict[str, str]:
    """pip's effective value of each configured key."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and section in RANKS:
            found.setdefault(name, {})[section] = value.strip().strip("'\"")
    return {name: next(by[s] for s in RANKS if s in by) for name, by in found.items()}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    no_index = is_set(settings, "no-index")
    arguments: list[str] = ["--no-index"] if no_index else []
    for name, flag in LIST_FLAGS.items():
        if no_index and name in INDEX_FLAGS:
            continue  # pip ignores its indexes under no-index: only find-links count
        for item in settings.get(name, "").split():
            arguments += [flag, item]
    if settings.get("extra-index-url") and not no_index:
        arguments += ["--index-strategy", "unsafe-best-match"]
    return arguments


def main() -> int:
    uv, python, *rest = sys.argv[1:]
    settings = pip_settings()
    env = dict(os.environ)
    if settings.get("cert"):
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    if settings.get("default-timeout"):
        env.setdefault("UV_HTTP_TIMEOUT", settings["default-timeout"])
    command = [uv, "pip", "install", "--python", python, *uv_arguments(settings), *rest]
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
