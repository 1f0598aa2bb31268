"""``raypipe COMMAND [ARGS]``: one entry point over the scripts in ``jobs/``.

Each command runs ``jobs/COMMAND.py`` with the remaining arguments, exactly as
``python jobs/COMMAND.py ARGS`` (and ``ray job submit -- python jobs/COMMAND.py ARGS``) would.
"""

from __future__ import annotations

import ast
import runpy
import sys

from raypipe.config import REPO_ROOT

JOBS_DIR = REPO_ROOT / "jobs"


def available_jobs() -> dict[str, str]:
    """Job name -> first line of its docstring."""
    jobs = {}
    for path in sorted(JOBS_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        jobs[path.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return jobs


def usage() -> str:
    lines = ["usage: raypipe COMMAND [ARGS]  (raypipe COMMAND --help for a command's options)", "", "commands:"]
    lines += [f"  {name:<10} {summary}" for name, summary in available_jobs().items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    command, rest = argv[0], argv[1:]
    jobs = available_jobs()
    if command not in jobs:
        sys.exit(f"raypipe: unknown command {command!r}\n\n{usage()}")
    script = JOBS_DIR / f"{command}.py"
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")
