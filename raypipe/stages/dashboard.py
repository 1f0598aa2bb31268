"""The dashboard job: TensorBoard over a run directory's Tune experiments, until Ctrl-C.

Finds the log folders (:mod:`raypipe.analysis.dashboard_logs`), starts TensorBoard in this process (its
Python loader, ``--load_fast=false``: no data-server child process to outlive the command) and prints
its URL. SIGINT and SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from raypipe.analysis.dashboard_logs import DashboardError, log_roots, logdir_spec

DESCRIPTION = """Open a run's Ray Tune experiments in TensorBoard: prints the URL, serves until Ctrl-C.

Shows the sweep's trials (RUN_DIR/stopping/tune: one run per prediction head; its curves are indexed
by heuristic variant, see docs/pipeline.md) and the training stages' Ray Train results where they left
TensorBoard event files (RUN_DIR/models/, RUN_DIR/stoprag/). Serves on 127.0.0.1 by default: on a
cluster head, tunnel the port (ssh -L 6006:127.0.0.1:6006 HEAD) or pass --host 0.0.0.0.
"""


def start_tensorboard(spec: str, port: int | None, host: str) -> str:
    """Serve ``spec`` from a background thread of this process; returns the URL it listens on."""
    from tensorboard import program

    board = program.TensorBoard()
    port_flag = "default" if port is None else str(port)
    try:
        board.configure(argv=[None, "--logdir_spec", spec, "--port", port_flag, "--host", host, "--load_fast", "false"])
        return board.launch()
    except (program.TensorBoardServerException, OSError, ValueError) as exc:  # e.g. the port is in use
        raise DashboardError(f"TensorBoard did not start: {getattr(exc, 'msg', exc)}") from exc
    except SystemExit as exc:  # werkzeug prints why it cannot bind (an unknown host) and exits
        raise DashboardError(f"TensorBoard did not start on {host} (its reason is printed above)") from exc


def main() -> None:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory whose logs to show")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="port to serve on (default: 6006, or the next free one; 0: any free port)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    args = parser.parse_args()
    try:
        roots = log_roots(args.run_dir)
        url = start_tensorboard(logdir_spec(roots), args.port, args.host)
    except DashboardError as exc:
        sys.exit(f"error: {exc}")
    for name, path in roots.items():
        print(f"{name}: {path}")
    print(f"TensorBoard: {url}#scalars  (Ctrl-C stops it)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    print("TensorBoard stopped")
