"""A run directory: every stage reads and writes Parquet tables and the resolved config here."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from raypipe.core.config import ConfigError, RunConfig, dump_config
from raypipe.core.metrics import DEFAULT_RULE, RULES, Rule
from raypipe.core.models import embedded_llm_note

PARTIAL_SUFFIX = ".parquet.tmp"  # a part being written; renamed to .parquet when complete


class RunDirError(FileNotFoundError):
    """A stage's input table is missing; the message says which stage produces it."""


PRODUCERS = {
    "trajectories": "jobs/probe.py",
    "iterations": "jobs/probe.py",
    "features": "jobs/features.py",
    "predictions": "jobs/train.py",
}


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def table_dir(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        folder = self.table_dir(name)
        return folder.is_dir() and any(folder.glob("*.parquet"))

    def read(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """Read every Parquet part of a table."""
        if not self.has(name):
            producer = PRODUCERS.get(name, "an earlier stage")
            raise RunDirError(f"{self.table_dir(name)}: no {name} table here; run {producer} on {self.path} first")
        parts = sorted(self.table_dir(name).glob("*.parquet"))
        return pa.concat_tables([pq.read_table(p, columns=columns) for p in parts], promote_options="default")

    def write_part(self, name: str, table: pa.Table, part: str) -> Path:
        """Write one part atomically (temp file, then rename), so a crash never leaves half a file."""
        folder = self.table_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{part}.parquet"
        tmp = folder / f".{part}{PARTIAL_SUFFIX}"
        pq.write_table(table, tmp)
        tmp.replace(final)
        return final

    def remove_partial_writes(self, name: str) -> None:
        """Delete the temporary files of part writes that a crash cut short."""
        for tmp in self.table_dir(name).glob(f".*{PARTIAL_SUFFIX}"):
            tmp.unlink()

    def recorded(self, section: str, key: str, default: object = None) -> object:
        """``section.key`` as the probe run recorded it in ``config.yaml`` (``default`` where it does not)."""
        path = self.path / "config.yaml"
        recorded = yaml.safe_load(path.read_text()) if path.exists() else None
        return ((recorded or {}).get(section) or {}).get(key, default)

    def metric_rule(self) -> Rule:
        """The answer metric's rule its probe run scored with (``agent.metric`` in ``config.yaml``; the default
        where the run does not record one)."""
        rule = self.recorded("agent", "metric", DEFAULT_RULE)
        if rule not in RULES:
            raise ConfigError(f"{self.path / 'config.yaml'}: agent.metric {rule!r} is none of {', '.join(RULES)}")
        return rule

    def model_note(self) -> str | None:
        """The caveat for this run's figures when its generator is an embedded LLM (see
        :func:`raypipe.core.models.embedded_llm_note`)."""
        model, adapter = self.recorded("engine", "model"), self.recorded("engine", "adapter")
        return embedded_llm_note(
            model if isinstance(model, str) else None, adapter if isinstance(adapter, str) else None
        )

    def write_config(self, config: RunConfig, stage: str = "config") -> Path:
        path = self.path / f"{stage}.yaml"
        dump_config(config, path)
        return path


def model_notes(runs: Iterable[RunDir]) -> list[str]:
    """The distinct :meth:`RunDir.model_note` of ``runs``, in order: what goes beside figures that compare them."""
    return list(dict.fromkeys(note for run in runs if (note := run.model_note())))
