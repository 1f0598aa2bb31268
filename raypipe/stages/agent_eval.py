"""The agent-eval job (``raypipe agent-eval``, ``python jobs/agent_eval.py``): a tuned agent's dev-split figures.

Reads a probe run (made with ``--set data.split=dev --set engine.adapter=ARTIFACT``), prints
:func:`raypipe.agenttrain.dev_figures.dev_figures` and, with ``--artifact``, records them as the artifact's
manifest ``dev`` entry, once the run is checked to be that artifact's run on the whole dev split.
"""

from __future__ import annotations

import json
from pathlib import Path

from raypipe.agenttrain.dev_figures import dev_figures, format_figures
from raypipe.core.adapter import MANIFEST_FILE, ArtifactError, read_manifest
from raypipe.core.jobargs import job_parser, setup_logging
from raypipe.core.models import ModelNotFoundError, locate_adapter
from raypipe.core.rundir import RunDir, RunDirError

DESCRIPTION = """Print a probe run's agent figures; with --artifact, record them in the artifact's manifest (docs/agent-training.md).

Final F1 and EM, own answers, P_0 -> P_last, the share of trajectories whose best P_i comes before the end (RQ-1)
and the U_i distribution. --artifact DIR needs a run made with --set data.split=dev --set data.limit=null
--set engine.adapter=DIR.
"""  # noqa: E501 - the --help text as printed; its first line is the job's summary in `raypipe`


def main(argv: list[str] | None = None) -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a probe run directory")
    parser.add_argument("--artifact", metavar="DIR", help="write the figures into this artifact's manifest")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        evaluate(RunDir(Path(args.run_dir)), None if args.artifact is None else Path(args.artifact))
    except (RunDirError, ArtifactError, ModelNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None


def evaluate(run: RunDir, artifact: Path | None) -> None:
    figures = dev_figures(run)
    print(format_figures(figures))
    if artifact is None:
        return
    manifest = read_manifest(artifact)
    adapter, split, limit = (
        run.recorded(*key) for key in (("engine", "adapter"), ("data", "split"), ("data", "limit"))
    )
    if not isinstance(adapter, str) or locate_adapter(adapter).resolve() != artifact.resolve():
        raise SystemExit(f"error: {run.path} ran engine.adapter={adapter}, not {artifact}")
    if split != "dev" or limit is not None:
        raise SystemExit(f"error: {run.path} is not the whole dev split (data.split={split}, data.limit={limit})")
    manifest["dev"] = {**figures, "run": str(run.path)}
    (artifact / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    print(f"recorded in {artifact / MANIFEST_FILE}")
