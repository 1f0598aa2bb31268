"""The retrieval service as a Ray Serve deployment (``raypipe serve-retrieval``): the command's lifecycle,
the same ids and scores as the in-job service, and a probe job pointed at it by URL and by name."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from raypipe.cli import usage
from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import BUNDLED_CORPUS, Question
from raypipe.retrieval import LocalRetriever, encoder_spec
from raypipe.retrieval.http_client import HttpRetriever
from raypipe.testing.fakes import FakeEngine

ROOT = Path(__file__).resolve().parents[1]
N_PASSAGES = 40


def test_cli_lists_serve_retrieval():
    assert "serve-retrieval" in usage()
    proc = subprocess.run(
        [sys.executable, "-m", "raypipe", "serve-retrieval", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and "--port" in proc.stdout and "POST /retrieve" in proc.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, body: dict | None = None, token: str | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The first passages of the bundled corpus, indexed in-process (seconds)."""
    from raypipe.runtime.index_build import ensure_index

    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(N_PASSAGES)))
    config = load_config(
        "embedded",
        [
            f"data.corpus={corpus}",
            f"retrieval.index.dir={tmp_path_factory.mktemp('idx') / 'tiny'}",
            "retrieval.actors.max_wait_ms=10",
            "retrieval.serve.deployment=raypipe-test-retrieval",
            "retrieval.actors.num_cpus=0",
            "ray.num_cpus=2",
            "generation.batch_size=4",
            "generation.actors=1",
            "generation.actor_num_cpus=0.5",
            "retrieval.serve.max_body_bytes=100000",
        ],
    )
    ensure_index(config, use_ray=False)
    return config


@pytest.fixture(scope="module")
def local(config):
    from raypipe.retrieval import index_dir_for

    return LocalRetriever.open(index_dir_for(config), encoder_spec(config.retrieval))


@pytest.mark.slow
def test_command_prints_its_url_and_stops_cleanly_on_sigterm(config, tmp_path):
    """Runs before the in-process deployment below (module fixtures live until the module ends). Started with a
    token (from the environment, as docs/retrieval.md advises): every HTTP request must carry it."""
    import urllib.error

    from raypipe.core.http import TOKEN_ENV

    port, token = free_port(), "t0ken-for-the-test"
    settings = [
        f"data.corpus={config.data.corpus}",
        f"retrieval.index.dir={config.retrieval.index.dir}",
        "ray.num_cpus=1",
    ]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raypipe",
            "serve-retrieval",
            "--port",
            str(port),
            *(a for s in settings for a in ("--set", s)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), TOKEN_ENV: token},
    )
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if "retrieval service ready at" in line:
                break
        assert f"ready at http://127.0.0.1:{port}" in "".join(lines), "".join(lines[-30:])
        for wrong in (None, "not-the-token"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                get_json(f"http://127.0.0.1:{port}/retrieve", {"queries": ["Who is Ed Wood?"]}, token=wrong)
            assert refused.value.code == 401 and "Bearer" in json.loads(refused.value.read())["detail"]
        health = get_json(f"http://127.0.0.1:{port}/health", token=token)
        assert health["status"] == "ok" and health["passages"] == N_PASSAGES and health["token"] is True
        found = HttpRetriever(f"http://127.0.0.1:{port}", token=token).search_batch(["Who is Ed Wood?"], 3)
        assert len(found[0].hits) == 3
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "retrieval service stopped" in out
    with pytest.raises(OSError):
        get_json(f"http://127.0.0.1:{port}/health", token=token)


@pytest.fixture(scope="module")
def service(config, ray_local):
    """The deployment on the module's local Ray, at a free port, for the rest of the module."""
    from raypipe.retrieval import index_dir_for
    from raypipe.runtime.serve import deploy_retrieval, undeploy_retrieval

    yield deploy_retrieval(config, index_dir_for(config), port=free_port())
    undeploy_retrieval(config)


def queries_for(local: LocalRetriever) -> list[str]:
    docs = local.docs.get(range(0, N_PASSAGES, 5))
    return [*(f"Who is {d.title}?" for d in docs), docs[0].text[:80], "  "]


def ids_and_scores(results) -> list[list[tuple[str, float]]]:
    return [[(h.doc_id, h.score) for h in r.hits] for r in results]


@pytest.mark.slow
def test_every_path_returns_the_in_job_ids_and_scores(config, local, service):
    import asyncio

    from raypipe.runtime.retrieval import start_retrieval_service
    from raypipe.runtime.serve_client import ServeRetriever

    queries, k = queries_for(local), 10
    expected = ids_and_scores(local.search_batch(queries, k))
    actors = start_retrieval_service(config, local.index_dir.path)
    try:
        in_job = ids_and_scores(asyncio.run(actors.search(queries, k)))
    finally:
        actors.shutdown()
    over_http = HttpRetriever(service).search_batch(queries, k)
    by_handle = asyncio.run(
        ServeRetriever(config.retrieval.serve.deployment, config.retrieval.serve.timeout_s).search(queries, k)
    )
    assert in_job == expected
    assert ids_and_scores(over_http) == expected  # scores exactly: floats survive JSON
    assert ids_and_scores(by_handle) == expected
    assert over_http[-1].empty_query and by_handle[-1].empty_query
    hit, mine = over_http[0].hits[0], local.search_batch(queries[:1], 1)[0].hits[0]
    assert (hit.title, hit.text) == (mine.title, mine.text)

    # an outside client: Search-R1's request, its topk fallback (3), and documents alone without scores
    raw = get_json(f"{service}/retrieve", {"queries": queries[:2]})
    assert [[d["id"] for d in ranked] for ranked in raw["result"]] == [
        [i for i, _ in ranked[:3]] for ranked in expected[:2]
    ]
    scored = get_json(f"{service}/retrieve", {"queries": queries[:1], "topk": 2, "return_scores": True})
    assert [(h["document"]["id"], h["score"]) for h in scored["result"][0]] == expected[0][:2]
    health = get_json(f"{service}/health")
    assert health["passages"] == N_PASSAGES and health["batches"] >= 2


@pytest.mark.slow
def test_corpus_calls_answer_as_the_in_job_actors(config, local, service):
    """The features' corpus calls over the actors, the Serve handle and HTTP (in chunks) give the replica's answers."""
    import urllib.error

    import numpy as np

    from raypipe.retrieval.store import tokenize
    from raypipe.runtime.corpus_service import CorpusAnswers, HttpTransport, ReplicaTransport, ServeTransport
    from raypipe.runtime.retrieval import start_retrieval_service
    from raypipe.runtime.serve_client import ServeRetriever

    docs = local.docs.get(range(0, N_PASSAGES, 3))
    ids = [d.doc_id for d in docs][::-1]
    terms = [*dict.fromkeys(tokenize(f"{docs[0].title} {docs[0].text} {docs[1].title}")), "zzzunseen"]
    texts = [f"Who is {d.title}?" for d in docs[:6]]
    mine = CorpusAnswers(local)
    expected = (mine.corpus_info(), mine.doc_vectors(ids), mine.document_frequencies(terms), mine.encode_queries(texts))
    assert expected[2] == [local.index_dir.stats.df(t) for t in terms] and expected[2][-1] == 0
    actors = start_retrieval_service(config, local.index_dir.path)
    try:
        transports = {
            "actors": ReplicaTransport(actors),
            "serve": ServeTransport(
                ServeRetriever(config.retrieval.serve.deployment, config.retrieval.serve.timeout_s)
            ),
            "http": HttpTransport(HttpRetriever(service), chunk=4),
        }
        got = {
            name: (t.corpus_info(), t.doc_vectors(ids), t.document_frequencies(terms, "plain"), t.encode_queries(texts))
            for name, t in transports.items()
        }
    finally:
        actors.shutdown()
    for name, (info, vectors, dfs, queries) in got.items():
        assert info == expected[0] and info["n_docs"] == N_PASSAGES, name
        assert vectors.dtype == np.float32 and np.array_equal(vectors, expected[1]), name  # exactly, JSON included
        assert dfs == expected[2], name
        np.testing.assert_allclose(queries, expected[3], rtol=0, atol=1e-6, err_msg=name)

    # what an outside client sees: JSON lists of floats, and a clear 400 for an unknown passage
    raw = get_json(f"{service}/raypipe/doc_vectors", {"doc_ids": ids[:2]})
    assert raw["dimension"] == expected[1].shape[1] and raw["vectors"] == expected[1][:2].tolist()
    assert get_json(f"{service}/raypipe/document_frequencies", {"terms": terms[:3]})["df"] == expected[2][:3]
    with pytest.raises(urllib.error.HTTPError) as refused:
        get_json(f"{service}/raypipe/doc_vectors", {"doc_ids": ["no-such-passage"]})
    assert refused.value.code == 400 and "no-such-passage" in refused.value.read().decode()
    assert get_json(f"{service}/health")["corpus_endpoints"] == "/raypipe"


def features_run(path: Path, local: LocalRetriever) -> RunDir:
    """A small run over the tiny index: 4 questions, each with a probe-only iteration and 2 searches."""
    from raypipe.core.schema import STOP_ANSWER, conform

    run = RunDir(path)
    docs = local.docs.get(range(0, N_PASSAGES, 4))
    iterations, trajectories = [], []
    for q in range(4):
        first, second = docs[q], docs[q + 4]
        queries = [f"{first.title} {second.title}", f"what about {second.text[:40]}"]
        rows = [
            {
                "qid": f"q{q}",
                "dataset": "toy",
                "iteration": 0,
                "query": None,
                "doc_ids": [],
                "doc_scores": [],
                "reasoning": f"I should look up {first.title}.",
                "probe_token_logprobs": [-0.1 * (q + 1)] * 5,
                "probe_f1": 0.0,
                "utility": None,
            }
        ]
        for i, result in enumerate(local.search_batch(queries, 10), start=1):
            rows.append(
                {
                    "qid": f"q{q}",
                    "dataset": "toy",
                    "iteration": i,
                    "query": result.query,
                    "doc_ids": [h.doc_id for h in result.hits],
                    "doc_scores": [h.score for h in result.hits],
                    "reasoning": f"Step {i}: {result.hits[0].title} is mentioned.",
                    "probe_token_logprobs": [-0.3 / i] * 4,
                    "probe_f1": 0.5 * i,
                    "utility": 0.5,
                }
            )
        for row in rows:
            row.update(probe_answer="x", tokens_generated=5, probe_tokens=4)
        iterations += rows
        trajectories.append(
            {
                "qid": f"q{q}",
                "dataset": "toy",
                "question": f"Who links {first.title} and {second.title}?",
                "golden_answers": ["x"],
                "final_answer": "x",
                "final_f1": 1.0,
                "n_iterations": 2,
                "stop_reason": STOP_ANSWER,
                "error": None,
                "tokens_generated": 15,
                "probe_tokens": 12,
                "wall_s": 1.0,
                "transcript": "",
            }
        )
    run.write_part("iterations", conform(iterations, "iterations"), "part-0")
    run.write_part("trajectories", conform(trajectories, "trajectories"), "part-0")
    return run


@pytest.mark.slow
def test_features_stage_through_the_deployment_equals_the_in_job_service(config, local, service, tmp_path):
    """jobs/features.py's stage with its corpus and searches from the deployment, by name and by URL."""
    from raypipe.core.schema import FEATURE_COLUMNS
    from raypipe.stages.features import run_features
    from raypipe.testing.synthetic import HashEncoder

    run = features_run(tmp_path / "run", local)
    tables = {}
    for backend in ("actors", "serve", "http"):
        job = config.model_copy(
            update={
                "retrieval": config.retrieval.model_copy(
                    update={"backend": backend, "http": config.retrieval.http.model_copy(update={"url": service})}
                )
            }
        )
        assert run_features(run, job, sentence_factory=HashEncoder) == 12
        tables[backend] = {(r["qid"], r["iteration"]): r for r in run.read("features").to_pylist()}
    assert len(tables["actors"]) == 12
    searched = [r for r in tables["actors"].values() if r["iteration"] > 0]
    for name in ("nqc_seed", "a_pair_ratio", "dense_qpp", "rbo_question_3"):
        assert all(r[name] is not None for r in searched), name
    for backend in ("serve", "http"):
        assert tables[backend].keys() == tables["actors"].keys()
        for key, row in tables["actors"].items():
            for name in FEATURE_COLUMNS:
                expected = row[name] if row[name] is None else pytest.approx(row[name], rel=1e-6, abs=1e-9)
                assert tables[backend][key][name] == expected, (backend, key, name)


def titles_engine(config):
    """Each question searches for its own text once, then answers."""

    def script(request):
        question = request.prompt.split("Question: ")[1].split("\n")[0].strip()
        if request.prompt.endswith("<answer>"):
            return " something </answer>"
        if "Doc 1(" in request.prompt:
            return "<think> done </think>\n<answer> something </answer>"
        return f"<think> look </think>\n<search> {question} </search>"

    return FakeEngine(script)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["http", "serve"])
def test_probe_job_against_the_deployment(config, local, service, tmp_path, backend):
    from raypipe.stages.probe import run_probe

    docs = local.docs.get(range(0, 24, 3))
    questions = [
        Question(qid=f"q{i}", dataset="toy", question=f"Who is {d.title}", golden_answers=["x"])
        for i, d in enumerate(docs)
    ]
    job = config.model_copy(
        update={
            "retrieval": config.retrieval.model_copy(
                update={"backend": backend, "http": config.retrieval.http.model_copy(update={"url": service})}
            )
        }
    )
    run = RunDir(tmp_path / "run")
    assert run_probe(job, run, questions, engine_factory=titles_engine) == len(questions)

    info = yaml.safe_load((run.path / "probe_info.yaml").read_text())["retrieval_service"]
    assert info["backend"] == backend and info["health"]["passages"] == N_PASSAGES
    if backend == "http":
        assert info["url"] == service and info["health"]["endpoint"] == "GET /health"
    assert load_config(run.path / "config.yaml").retrieval.backend == backend
    rows = [r for r in run.read("iterations").to_pylist() if r["query"]]
    assert len(rows) == len(questions)
    # The job's searches were coalesced into batches of its own timing; the encoder's float rounding
    # depends on the batch, so scores match to float32 precision here (exactly, for one same batch, above).
    expected = local.search_batch([r["query"] for r in rows], job.retrieval.deep_k)
    assert [r["doc_ids"] for r in rows] == [[h.doc_id for h in e.hits] for e in expected]
    for row, e in zip(rows, expected):
        assert row["doc_scores"] == pytest.approx([h.score for h in e.hits], abs=1e-5)


def refusal(url: str, body: dict | bytes) -> tuple[int, object]:
    """The HTTP status and JSON ``detail`` of a request the service refuses."""
    import urllib.error

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    return refused.value.code, json.loads(refused.value.read())["detail"]


@pytest.mark.slow
def test_one_request_takes_no_more_than_the_limits_allow(config, local, service):
    """Each limit a 4xx whose JSON detail names its setting; topk above the corpus gets the corpus; /health
    shows no file path; the replica serves on after every refusal."""
    cfg = config.retrieval
    too_many = ["Who is Ed Wood?"] * (cfg.serve.max_queries + 1)
    cases = [
        ("/retrieve", {"queries": too_many}, 413, "retrieval.serve.max_queries"),
        ("/retrieve", {"queries": ["Who is Ed Wood?"], "topk": 10**12}, 422, "retrieval.serve.max_topk"),
        ("/retrieve", {"queries": ["x" * cfg.serve.max_body_bytes]}, 413, "retrieval.serve.max_body_bytes"),
        (
            "/raypipe/document_frequencies",
            {"terms": ["ed"] * (cfg.serve.max_items + 1)},
            413,
            "retrieval.serve.max_items",
        ),
        ("/raypipe/doc_vectors", {"doc_ids": ["p1"] * (cfg.serve.max_items + 1)}, 413, "retrieval.serve.max_items"),
        ("/raypipe/encode_queries", {"texts": ["q"] * (cfg.serve.max_items + 1)}, 413, "retrieval.serve.max_items"),
    ]
    for path, body, status, setting in cases:
        code, detail = refusal(f"{service}{path}", body)
        assert (code, setting in detail) == (status, True), (path, code, detail)
    code, detail = refusal(f"{service}/retrieve", b'{"queries": ["unclosed"')
    assert code == 422 and isinstance(detail, list)  # FastAPI's own validation answer, also JSON

    deepest = get_json(f"{service}/retrieve", {"queries": ["Who is Ed Wood?"], "topk": cfg.serve.max_topk})
    assert len(deepest["result"][0]) == N_PASSAGES  # above the passages indexed: all of them
    health = get_json(f"{service}/health")
    assert "index" not in health and str(cfg.index.dir) not in json.dumps(health)
    assert health["limits"]["max_queries"] == cfg.serve.max_queries and health["token"] is False
    queries = queries_for(local)
    expected = ids_and_scores(local.search_batch(queries, 5))
    assert ids_and_scores(HttpRetriever(service).search_batch(queries, 5)) == expected
