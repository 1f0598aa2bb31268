"""The machine a figure was measured on: CPU model, its instruction-set flags and core count."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

ISA_FLAGS = re.compile(r"^(avx2|avx512\w*|avx_vnni|amx\w*|fma)$")


def cpu_description() -> tuple[str, str, int]:
    """(model name, instruction-set flags, logical cores) from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown", "unknown", os.cpu_count() or 0
    field: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    flags = " ".join(sorted(f for f in field.get("flags", "").split() if ISA_FLAGS.match(f)))
    return field.get("model name", "unknown"), flags, os.cpu_count() or 0
