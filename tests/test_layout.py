"""The package's shape (issue 17): Ray-free domain packages that import downward only, thin job entry points.

Every import counts, lazy ones inside functions included, because a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "raypipe"
JOBS = PACKAGE.parent / "jobs"

# Lowest first. A module may import its own layer and the layers before it, never one after it.
DOMAIN = ["core", "data", "llm", "retrieval", "agents", "features", "predict", "stopping", "stoprag", "analysis"]
LAYERS = [*DOMAIN, "runtime", "stages", "cli", "testing"]
STAGE_JOBS = {"index", "probe", "features", "train", "sweep", "stoprag", "report", "serve"}


def layer_of(module: str) -> str | None:
    """The layer of a ``raypipe.x.y`` module name (``raypipe.cli`` and ``raypipe.__main__`` are the CLI)."""
    parts = module.split(".")
    if parts[0] != "raypipe" or len(parts) < 2:
        return None
    return "cli" if parts[1] in ("cli", "__main__") else parts[1]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in a file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names if node.module == "raypipe"]
    return found


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_every_module_belongs_to_a_known_layer():
    unknown = {module_name(p) for p in package_modules() if layer_of(module_name(p)) not in (*LAYERS, None)}
    unknown.discard("raypipe")
    assert not unknown, f"modules outside the layers {LAYERS}: {sorted(unknown)}"


@pytest.mark.parametrize("layer", DOMAIN)
def test_domain_packages_do_not_import_ray(layer):
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in package_modules()
        if layer_of(module_name(path)) == layer
        for line, name in imports_of(path)
        if name == "ray" or name.startswith("ray.")
    ]
    assert not offenders, "\n".join(offenders)


def test_imports_point_downward_only():
    offenders = []
    for path in package_modules():
        own = layer_of(module_name(path))
        if own is None:
            continue
        for line, name in imports_of(path):
            other = layer_of(name)
            if other in LAYERS and LAYERS.index(other) > LAYERS.index(own):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({own}) imports {name} ({other})")
    assert not offenders, "\n".join(offenders)


def test_stages_hold_one_module_per_job():
    modules = {p.stem for p in (PACKAGE / "stages").glob("*.py") if p.stem != "__init__"}
    assert modules == STAGE_JOBS


def test_the_cli_knows_every_job():
    from raypipe.cli import JOBS as CLI_JOBS

    assert set(CLI_JOBS) == STAGE_JOBS


@pytest.mark.parametrize("job", sorted(STAGE_JOBS))
def test_job_entry_points_are_thin(job):
    """``python jobs/X.py`` (what users hand to ``ray job submit``) only calls the stage's main()."""
    tree = ast.parse((JOBS / f"{job}.py").read_text())
    code = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    imported = [n for n in code if isinstance(n, ast.ImportFrom)]
    assert [(n.module, [a.name for a in n.names]) for n in imported] == [(f"raypipe.stages.{job}", ["main"])]
    assert len(code) == 2, "an import and the __main__ guard, nothing else"
