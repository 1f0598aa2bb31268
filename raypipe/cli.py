"""``raypipe COMMAND [ARGS]``: one entry point over the jobs in :mod:`raypipe.stages`.

Each command runs ``raypipe.stages.JOB.main`` with the remaining arguments, exactly as
``python jobs/JOB.py ARGS`` (and ``ray job submit -- python jobs/JOB.py ARGS``) would; the command is
the job's name, except ``serve-retrieval`` (job ``serve``) and ``serve-agent`` (job ``serve_agent``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

COMMANDS = {
    name: name for name in ("index", "probe", "features", "train", "sweep", "stoprag", "report", "compare", "dashboard")
}
COMMANDS["serve-retrieval"] = "serve"
COMMANDS["serve-agent"] = "serve_agent"
COMMANDS["agent-data"] = "agent_data"
COMMANDS["tune-agent"] = "tune_agent"
COMMANDS["agent-eval"] = "agent_eval"
JOBS = tuple(COMMANDS.values())  # the modules of raypipe.stages


def job_summary(name: str) -> str:
    """The first line of a job's DESCRIPTION, read from its source: listing the jobs imports none of them
    (each pulls in Ray, torch or vLLM)."""
    tree = ast.parse(Path(importlib.util.find_spec(f"raypipe.stages.{name}").origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DESCRIPTION" for t in node.targets):
            return ast.literal_eval(node.value).strip().splitlines()[0]
    raise LookupError(f"raypipe.stages.{name} has no DESCRIPTION")


def usage() -> str:
    lines = ["usage: raypipe COMMAND [ARGS]  (raypipe COMMAND --help for a command's options)", "", "commands:"]
    lines += [f"  {command:<16} {job_summary(job)}" for command, job in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.exit(f"raypipe: unknown command {command!r}\n\n{usage()}")
    module = importlib.import_module(f"raypipe.stages.{COMMANDS[command]}")
    sys.argv = [f"raypipe {command}", *rest]
    module.main()
