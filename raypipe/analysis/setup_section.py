"""The report's "Setup" panel: every setting of the run that differs from the seed paper's setup.

Compares the run's configuration with :data:`raypipe.core.seed_setup.SEED_SETUP`. The configuration is
the one each stage ran with: ``config.yaml`` (probe: agent, retrieval, data), overlaid with the
``train`` section and ``train_run`` of ``train.yaml``, the ``stopping`` section of ``sweep.yaml`` and the
``stoprag`` section and ``train_run`` of ``stoprag.yaml`` when those stages have run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import yaml

from raypipe.analysis.blocks import Block, Table, Text
from raypipe.core.config import migrate_tree
from raypipe.core.seed_setup import SEED_SETUP

if TYPE_CHECKING:
    from raypipe.analysis.report import ReportContext

# stage config file -> the sections (and top-level keys) it is the authority for
STAGE_FILES = {"train.yaml": ("train", "train_run"), "sweep.yaml": ("stopping",), "stoprag.yaml": ("stoprag",)}
MISSING = object()


def run_tree(run_path: Path) -> tuple[dict[str, Any], list[str]]:
    """The merged configuration tree of a run and the files it was read from."""
    tree, used = {}, []
    base = run_path / "config.yaml"
    if base.exists():
        tree = yaml.safe_load(base.read_text()) or {}
        used.append(base.name)
    for name, keys in STAGE_FILES.items():
        path = run_path / name
        if not path.exists():
            continue
        stage = yaml.safe_load(path.read_text()) or {}
        for key in keys:
            if key in stage:
                tree[key] = stage[key]
        used.append(name)
    return migrate_tree(tree), used  # a run written before a key moved reads as today's


def effective_values(tree: dict[str, Any]) -> dict[str, Any]:
    """Values a protocol resolves: the documents the agent reads, its turn limit (as the run config is built)."""
    from raypipe.core.config import RunConfig

    retrieval = tree.get("retrieval") or {}
    try:  # the agent section and top_k only: other sections may hold keys of another version
        config = RunConfig.model_validate(
            {"agent": tree.get("agent") or {}, "retrieval": {"top_k": retrieval.get("top_k")}}
        )
    except ValueError:  # a config from another version: resolve nothing rather than guess
        return {}
    return {"max_turns": config.agent.max_turns, "top_k": config.retrieval.top_k}


def lookup(tree: dict[str, Any], effective: dict[str, Any], key: str) -> Any:
    if key.startswith("effective."):
        return effective.get(key.removeprefix("effective."), MISSING)
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def _show(value: Any) -> str:
    if value is MISSING:
        return "(not in this run's config)"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def setup_rows(run_path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Every seed setting with the run's value and whether it matches; the config files read."""
    tree, used = run_tree(run_path)
    effective = effective_values(tree)
    protocol = str((tree.get("agent") or {}).get("protocol", "search_r1"))
    rows = []
    for setting in SEED_SETUP:
        value = lookup(tree, effective, setting.key)
        same = value is not MISSING and setting.matches(value, protocol)
        rows.append(
            {
                "area": setting.area,
                "setting": setting.key.removeprefix("effective."),
                "this run": _show(value),
                "seed paper": _show(setting.seed_value(protocol)),
                "source": setting.source,
                "matches": same,
            }
        )
    return pd.DataFrame(rows), used


def agent_line(run_path: Path) -> str:
    """Which agent ran, from ``probe_info.yaml``: the model as it is, or the tuned-agent artifact and how it was
    made."""
    info_path = run_path / "probe_info.yaml"
    info = (yaml.safe_load(info_path.read_text()) or {}) if info_path.exists() else {}
    model = (info.get("engine") or {}).get("model", "(not recorded)")
    agent = info.get("agent") or {}
    if not agent.get("tuned"):
        return f"Agent: {model} as published (no tuned-agent artifact)."
    dev = agent.get("dev") or {}
    dev_text = (
        f"; its dev split: final F1 {dev['final_f1']:.3f}, P_0 -> P_last {dev['retrieval_gain']:+.3f}"
        if "final_f1" in dev
        else "; not evaluated on the dev split"
    )
    return (
        f"Agent: {model} with the tuned-agent artifact {agent['adapter']} "
        f"(sha256 {str(agent['adapter_sha256'])[:12]}): "
        f"{agent['note']}; {agent['trajectories']} trajectories, {agent['steps']} steps, seed {agent['seed']}"
        f"{dev_text} (docs/agent-training.md)."
    )


def render_setup(ctx: ReportContext) -> list[Block]:
    frame, used = setup_rows(ctx.run.path)
    ctx.write_csv("setup", frame)
    differs = frame[~frame["matches"]].drop(columns="matches")
    note = (
        f"Read from {', '.join(used)}; {int(frame['matches'].sum())} of {len(frame)} settings of the seed "
        "paper's setup (raypipe/core/seed_setup.py) match and are not shown; every one is in tables/setup.csv."
    )
    agent = Text(agent_line(ctx.run.path))
    if differs.empty:
        return [agent, Text(f"This run uses the seed paper's setup in every listed setting. {note}")]
    return [agent, Table(f"{len(differs)} settings differ from the seed paper's setup", differs, note=note)]
