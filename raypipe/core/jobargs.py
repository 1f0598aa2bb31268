"""Argument parsing shared by every job under ``jobs/``: the preset, overrides, logging."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from raypipe.core.config import DEFAULT_PRESET, ConfigError, RunConfig, load_config


def job_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every job shares: ``--config`` and repeated ``--set``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config",
        default=DEFAULT_PRESET,
        metavar="PRESET",
        help=f"preset name (raypipe/presets/) or a YAML path (default: {DEFAULT_PRESET})",
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
    if args.config == DEFAULT_PRESET and (run_dir / "config.yaml").exists():
        args.config = str(run_dir / "config.yaml")
        return config_from_args(args, legacy_run_overrides(run_dir / "config.yaml"))
    return config_from_args(args)


def legacy_run_overrides(path: Path) -> list[str]:
    """Overrides that keep a run written before a default changed on what it ran with: a run's
    config.yaml without ``retrieval.encoder_quantization`` used the fp32 encoder (the default became
    int8 for minilm), so a later stage or a resume must query the same fp32 index."""
    import yaml

    tree = yaml.safe_load(path.read_text()) or {}
    retrieval = tree.get("retrieval") if isinstance(tree, dict) else None
    if isinstance(retrieval, dict) and "encoder_quantization" not in retrieval:
        return ["retrieval.encoder_quantization=none"]
    return []
