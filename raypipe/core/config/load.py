"""Presets, ``--set`` overrides, loading and writing a run config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from raypipe.core.config.base import ConfigError, nested_section
from raypipe.core.config.migrate import migrate_key, migrate_tree
from raypipe.core.config.run import RunConfig

PRESET_DIR = Path(__file__).resolve().parents[2] / "presets"  # inside the package: a wheel has them
DEFAULT_PRESET = "embedded"


def known_presets() -> list[str]:
    """The preset names shipped in the package."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(preset: str | Path) -> Path:
    """A preset name (``raypipe/presets/<name>.yaml``) or a YAML path."""
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        return path
    named = PRESET_DIR / f"{preset}.yaml"
    if not named.exists():
        raise ConfigError(f"unknown preset {preset!r}; known presets: {', '.join(known_presets())}")
    return named


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Apply one ``a.b.c=value`` override in place; the value is parsed as YAML. An old key name is read as its
    new one (:func:`~raypipe.core.config.migrate.migrate_key`)."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    parts = migrate_key(key.strip()).split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None


def load_config(preset: str | Path = DEFAULT_PRESET, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load a preset, apply overrides, validate. Raises :class:`ConfigError` with every problem listed."""
    path = preset_path(preset)
    tree = preset_tree(path)
    for override in overrides:
        apply_override(tree, override)
    try:
        return RunConfig.model_validate(migrate_tree(tree))  # again: a whole section set by an override
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration ({path}):\n{_describe(exc)}") from None


def preset_tree(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A preset file's settings, old key names moved to their new places; ``extends: PRESET`` starts from that
    preset's and overlays this file's, key by key (a preset that differs from another in a few settings says only
    those)."""
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(tree).__name__}")
    base = tree.pop("extends", None)
    tree = migrate_tree(tree)
    if base is None:
        return tree
    base_path = preset_path(str(base))
    if base_path in (*seen, path):
        raise ConfigError(f"{path}: extends {base} in a cycle")
    return _overlay(preset_tree(base_path, (*seen, path)), tree, RunConfig)


def _overlay(base: dict[str, Any], top: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """``top``'s values over ``base``'s; a section or sub-section in both is overlaid the same way, key by key (a
    mapping-valued setting, such as ``retrieval.actors.resources``, is replaced whole)."""
    merged = dict(base)
    for key, value in top.items():
        section = nested_section(model, key)
        if section is not None and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _overlay(merged[key], value, section)
        else:
            merged[key] = value
    return merged


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key")
        elif not err["loc"]:  # a check across sections: its message names the settings (the input is the whole tree)
            lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def dump_config(config: RunConfig, path: Path) -> None:
    """Write the resolved configuration (every field, defaults included)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
