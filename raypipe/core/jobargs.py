"""Argument parsing shared by every job under ``jobs/``: the preset, overrides, logging."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from raypipe.core.config import DEFAULT_PRESET, ConfigError, RunConfig, TrainConfig, known_presets, load_config


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
    """Log to the terminal: raypipe's INFO lines and everyone's warnings, or with ``verbose`` everything
    from DEBUG up. Other libraries' INFO lines (FAISS's loader, ONNX Runtime's quantiser, Ray's start-up)
    still reach the log files a job adds (the probe's ``RUN_DIR/logs/driver.log``)."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not verbose:
        for handler in root.handlers:
            if handler not in handlers:  # the terminal's handler basicConfig made, not a host's (pytest's)
                handler.addFilter(_raypipe_or_warning)


def _raypipe_or_warning(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name.split(".")[0] in ("raypipe", "__main__")


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
        args.overrides = [*run_overrides(path), *args.overrides]  # the run's first: --set still applies
        return config_from_args(args, legacy_run_overrides(path))
    return config_from_args(args)


def run_overrides(path: Path) -> list[str]:
    """Overrides that keep a run's ``config.yaml`` loading as it ran: head refits with an old regulariser are
    converted (:func:`refit_alpha_overrides`); renamed and moved keys are read by the loader
    (:mod:`raypipe.core.config.migrate`)."""
    return refit_alpha_overrides(_yaml_tree(path))


def refit_alpha_overrides(tree: dict) -> list[str]:
    """An old run's head refits (``stopping.refits``) carry ``head_alpha``: scikit-learn's L2 term, with which
    the sklearn head was refit on batches of ``train.head_batch_size`` (B). They now carry the seed head's
    Adam ``head_weight_decay``, from which the sklearn head derives ``alpha = decay x B / 2``
    (:func:`raypipe.predict.head.equivalent_alpha`: the same weight update on full batches). So the old
    alpha is read as the decay ``2 x alpha / B``: with ``train.head=sklearn`` the refit uses exactly the
    alpha it had, with the seed head the decay equivalent to it (not alpha itself, B / 2 times stronger)."""
    stopping = tree.get("stopping")
    refits = stopping.get("refits") if isinstance(stopping, dict) else None
    if not isinstance(refits, list) or not any(isinstance(i, dict) and "head_alpha" in i for i in refits):
        return []
    train = tree.get("train")
    if not isinstance(train, dict):
        train = {}
    batch = train.get("head_batch_size", TrainConfig.model_fields["head_batch_size"].default)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(
            f"train.head_batch_size={batch!r}: an old run's stopping.refits head_alpha needs it to be "
            "converted to head_weight_decay; set it to the batch size the run used (default 256)"
        )
    converted = []
    for item in refits:
        if isinstance(item, dict) and "head_alpha" in item:
            if "head_weight_decay" in item:
                raise ConfigError(
                    "stopping.refits: an item has both head_alpha (an old run's sklearn L2 term) and "
                    f"head_weight_decay: {item}; keep one (head_weight_decay = 2 x head_alpha / "
                    "train.head_batch_size)"
                )
            alpha = item["head_alpha"]
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
                raise ConfigError(f"stopping.refits: head_alpha={alpha!r} is not a number")
            item = {**{k: v for k, v in item.items() if k != "head_alpha"}, "head_weight_decay": 2 * alpha / batch}
        converted.append(item)
    return [f"stopping.refits={json.dumps(converted)}"]


def legacy_run_overrides(path: Path) -> list[str]:
    """Overrides that keep a run written before a default changed on what it ran with. A run's
    config.yaml without ``retrieval.encoder_quantization`` used the fp32 encoder (written before the key);
    a run that says ``auto`` (the default from then until fp32 became the default again) keeps resolving it
    as it did, int8 for minilm, and one that names ``int8`` or ``none`` keeps it: a later stage or a resume
    queries the index the run was made with."""
    retrieval = _yaml_tree(path).get("retrieval")
    if isinstance(retrieval, dict) and "encoder_quantization" not in retrieval:
        return ["retrieval.encoder_quantization=none"]
    return []


def _yaml_tree(path: Path) -> dict:
    import yaml

    tree = yaml.safe_load(path.read_text()) or {}
    return tree if isinstance(tree, dict) else {}
