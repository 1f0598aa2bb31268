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
DOMAIN = [
    "core",
    "data",
    "llm",
    "retrieval",
    "agents",
    "features",
    "predict",
    "stopping",
    "stoprag",
    "analysis",
    "agenttrain",
]
LAYERS = [*DOMAIN, "runtime", "stages", "cli", "testing"]
STAGE_JOBS = {
    "index",
    "probe",
    "features",
    "train",
    "sweep",
    "stoprag",
    "report",
    "serve",
    "serve_agent",
    "compare",
    "dashboard",
    "agent_data",
    "tune_agent",
    "agent_eval",
}


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
            # `from raypipe.x import y`: y may be a module
            found += [
                (node.lineno, f"{node.module}.{alias.name}")
                for alias in node.names
                if node.module.split(".")[0] == "raypipe"
            ]
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


def test_a_stage_module_imports_no_other_stage_module():
    """A job's module is wiring for that job alone: what two jobs share (index building, the services' start and
    stop) lives in ``raypipe.runtime`` (issue 42)."""
    offenders = {  # one line per import statement
        f"{path.relative_to(PACKAGE.parent)}:{line}": f"imports {name}"
        for path in sorted((PACKAGE / "stages").glob("*.py"))
        for line, name in imports_of(path)
        if (name == "raypipe.stages" or name.startswith("raypipe.stages.")) and name != module_name(path)
    }
    assert not offenders, "\n".join(f"{where} {what}" for where, what in reversed(offenders.items()))


def is_service_module(path: Path) -> bool:
    """A service module defines a Ray Serve deployment: a class decorated with ``serve.deployment`` (called or not)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(target) == "serve.deployment":
                    return True
    return False


SERVICE_MODULES = {"raypipe.runtime.serve", "raypipe.runtime.serve_agent"}  # serve-retrieval's, serve-agent's


def test_the_service_modules_are_the_serve_deployments():
    assert {module_name(p) for p in package_modules() if is_service_module(p)} == SERVICE_MODULES


def test_a_service_does_not_import_another_services_module():
    """What the services share (the request gate, the token check, the proxy, undeploying) lives in
    ``raypipe.runtime.service``, not in one of them (issue 42)."""
    offenders = {  # one line per import statement
        f"{path.relative_to(PACKAGE.parent)}:{line}": f"imports {name}"
        for path in package_modules()
        if (own := module_name(path)) in SERVICE_MODULES
        for line, name in imports_of(path)
        if any(name == other or name.startswith(other + ".") for other in SERVICE_MODULES - {own})
    }
    assert not offenders, "\n".join(f"{where} {what}" for where, what in offenders.items())


STAGE_MAX_LINES = 300  # issue 26: a stage module is wiring (its Ray adapter, its driver, its main), well under this


def test_stage_modules_stay_under_the_size_target():
    over = [
        f"{path.relative_to(PACKAGE.parent)}: {lines} lines"
        for path in sorted((PACKAGE / "stages").glob("*.py"))
        if (lines := len(path.read_text().splitlines())) >= STAGE_MAX_LINES
    ]
    assert not over, f"{STAGE_MAX_LINES} lines or more (move the domain code down):\n" + "\n".join(over)


# getattr/hasattr on a value with one of these in its name, or asking for one of these attributes, probes an
# engine, a retriever or a retrieval client for a capability its protocol should declare.
PROBED_NAMES = ("engine", "retriever", "client", "service")
PROBED_ATTRIBUTES = {"supports_regex", "warmup", "describe", "node_ids", "shutdown", "actors", "prefetch_terms"}


def capability_probes(source: str) -> list[tuple[int, str]]:
    """(line, call) for every getattr/hasattr in ``source`` that probes an engine, retriever or client."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
        ):
            continue
        target, attribute = node.args[0], node.args[1]
        # the name the first argument ends in: engine, self.engine, self._retrieval_client
        name = target.id if isinstance(target, ast.Name) else (target.attr if isinstance(target, ast.Attribute) else "")
        asked = attribute.value if isinstance(attribute, ast.Constant) else None
        if any(word in name.lower() for word in PROBED_NAMES) or asked in PROBED_ATTRIBUTES:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_probe_check_finds_what_it_forbids():
    source = "\n".join(
        [
            'getattr(engine, "supports_regex", True)',
            'hasattr(self.client, "anything")',
            'getattr(corpus, "prefetch_terms", None)',
            "getattr(self._retriever, name)",
            'getattr(config, "model", None)',
            'hasattr(loader.sampler, "set_epoch")',
        ]
    )
    assert [line for line, _ in capability_probes(source)] == [1, 2, 3, 4]


def test_no_getattr_or_hasattr_probes_an_engine_or_a_retriever():
    """Capabilities are declared on the protocols (``Engine.supports_regex``, ``Engine.warmup``, the retrieval
    client's ``describe``, ``node_ids``, ``shutdown``) and checked with ``isinstance``, never probed."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {call}"
        for path in package_modules()
        for line, call in capability_probes(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)
