"""Argument parsing shared by every job under ``jobs/``: the preset, overrides, logging."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from raypipe.core.config import DEFAULT_PRESET, ConfigError, RunConfig, known_presets, load_config


def job_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every job shares: ``--config`` and repeated ``--set``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config",
        default=DEFAULT_PRESET,
        metavar="PRESET",
        help=f"a preset ({', '.join(known_presets())}) or a YAML path (default: {DEFAULT_PRESET})",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set engine.backend=transformers (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def config_from_args(args: argparse.Namespace, extra_overrides: list[str] | None = None) -> RunConfig:
    """Load the config the arguments name; exit with the validation message on error."""
    try:
        return load_config(args.config, [*args.overrides, *(extra_overrides or [])])
    except ConfigError as exc:
        sys.exit(f"error: {exc}")


def run_config_from_args(args: argparse.Namespace, run_dir: Path) -> RunConfig:
    """The config a later stage uses: the run's own ``config.yaml`` unless ``--config`` names another."""
    path = run_dir / "config.yaml"
    if args.config == DEFAULT_PRESET and path.exists():
        args.config = str(path)
        args.overrides = [*renamed_key_overrides(path), *args.overrides]  # renamed first: --set still applies
        return config_from_args(args, legacy_run_overrides(path))
    return config_from_args(args)


# Keys renamed since runs were written (section -> old name -> new name)
RENAMED_KEYS = {"stoprag": {"workers": "num_workers", "worker_num_cpus": "cpus_per_worker"}}
# Keys renamed inside the items of a list setting: a head refit's regulariser became the seed head's weight decay.
RENAMED_ITEM_KEYS = {("stopping", "refits"): {"head_alpha": "head_weight_decay"}}


def renamed_key_overrides(path: Path) -> list[str]:
    """Overrides that let a run's config.yaml written before a key was renamed load: each section that
    still has an old name is set whole, under the new names."""
    tree = _yaml_tree(path)
    overrides = []
    for section, renames in RENAMED_KEYS.items():
        values = tree.get(section)
        if isinstance(values, dict) and renames.keys() & values.keys():
            renamed = {renames.get(key, key): value for key, value in values.items()}
            overrides.append(f"{section}={json.dumps(renamed)}")  # JSON is YAML
    for (section, key), renames in RENAMED_ITEM_KEYS.items():
        items = (tree.get(section) or {}).get(key) if isinstance(tree.get(section), dict) else None
        if isinstance(items, list) and any(isinstance(i, dict) and renames.keys() & i.keys() for i in items):
            renamed = [{renames.get(k, k): v for k, v in i.items()} if isinstance(i, dict) else i for i in items]
            overrides.append(f"{section}.{key}={json.dumps(renamed)}")
    return overrides


def legacy_run_overrides(path: Path) -> list[str]:
    """Overrides that keep a run written before a default changed on what it ran with: a run's
    config.yaml without ``retrieval.encoder_quantization`` used the fp32 encoder (the default became
    int8 for minilm), so a later stage or a resume must query the same fp32 index."""
    retrieval = _yaml_tree(path).get("retrieval")
    if isinstance(retrieval, dict) and "encoder_quantization" not in retrieval:
        return ["retrieval.encoder_quantization=none"]
    return []


def _yaml_tree(path: Path) -> dict:
    import yaml

    tree = yaml.safe_load(path.read_text()) or {}
    return tree if isinstance(tree, dict) else {}
