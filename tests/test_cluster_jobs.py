"""The main job through ``ray job submit`` on a local head, then across two nodes placed by custom resources.

The head starts with token authentication (Ray 2.60's default for ``ray start --head``) and the job
client uses the same token, as on a real cluster (docs/cluster.md). The job is the embedded
default on one question per dataset, in float32, one trajectory at a time, with the chaos tests'
PROMPT_ALONE_ENGINE (one sequence per step, no prefix cache): each request's numerics are then a function
of its prompt alone, so greedy decoding gives the same tokens wherever the engine runs. Without it, a probe
that runs beside its trajectory's next turn shares steps by timing, and its log-probabilities moved in the
sixth digit between the two placements (CI, 2026-12-04); they are compared within the chaos tests'
LOGPROB_ATOL.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from raypipe.core.rundir import RunDir
from tests.helpers.chaos import LOGPROB_ATOL, PROMPT_ALONE_ENGINE, same_results
from tests.helpers.cluster import LocalCluster, cache_env

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DATASETS = ("hotpotqa", "2wikimultihopqa", "musique")


def job_args(corpus: Path, out: Path) -> list[str]:
    settings = [
        "engine.dtype=float32",
        "generation.max_concurrent_trajectories=1",
        *PROMPT_ALONE_ENGINE,
        "agent.max_turns=2",
        "agent.max_new_tokens=96",
        "agent.enforce_think_chars=150",
        f"data.corpus={corpus}",
    ]
    return [
        sys.executable,
        "jobs/probe.py",
        "--limit",
        "1",
        "--out",
        str(out),
        *(a for s in settings for a in ("--set", s)),
    ]


@pytest.fixture(scope="module")
def cluster():
    local = LocalCluster(extra_env=cache_env())  # the job's cache is the tests' own
    try:
        local.start_head(num_cpus=2, resources={"raypipe_retrieval": 1})
        yield local
    finally:
        local.stop()


def submit(cluster: LocalCluster, args: list[str], submission_id: str) -> str:
    log, status = cluster.submit_job(submission_id, ROOT, args)
    assert f"Job '{submission_id}' succeeded" in status, f"{status}\n{log[-5000:]}"
    return log


def test_submit_on_one_node_then_place_actors_on_two_nodes(cluster, paragraph_corpus, tmp_path):
    corpus = paragraph_corpus(DATASETS, 1)

    single = tmp_path / "single"
    log = submit(cluster, job_args(corpus, single), "raypipe-single-node")
    assert "3 new trajectories" in log and "P_0" in log  # the job's own summary reached the client
    single_run = RunDir(single)
    trajectories, iterations = (single_run.read(name).to_pylist() for name in ("trajectories", "iterations"))
    assert [t["dataset"] for t in trajectories].count("hotpotqa") == 1 and len(trajectories) == 3
    assert all(it["probe_f1"] is not None for it in iterations)
    head_id = yaml.safe_load((single / "probe_info.yaml").read_text())["retrieval_nodes"][0]

    cluster.add_node(num_cpus=1, resources={"raypipe_generation": 1})
    placed = tmp_path / "two-nodes"
    resources = [
        "--set",
        "generation.resources={raypipe_generation: 1}",
        "--set",
        "retrieval.actors.resources={raypipe_retrieval: 1}",
    ]
    submit(cluster, job_args(corpus, placed) + resources, "raypipe-two-nodes")
    info = yaml.safe_load((placed / "probe_info.yaml").read_text())
    generation_nodes = {engine["node_id"] for engine in info["engines"]}
    assert info["retrieval_nodes"] == [head_id]  # the only node with raypipe_retrieval
    assert generation_nodes and head_id not in generation_nodes  # the engine went to the raypipe_generation node
    assert same_results(RunDir(placed), single_run, logprob_atol=LOGPROB_ATOL) == []  # the same text and tokens
