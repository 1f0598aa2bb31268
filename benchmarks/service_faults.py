"""Bad input and faults at the retrieval service and its HTTP client: what happens, and that nothing is lost.

Two tables, both on loopback only and bounded (about 3 minutes on 2 cores):

* The service (``raypipe serve-retrieval``'s deployment over the first 40 passages of the bundled corpus, on
  a local 2-CPU Ray, started with a token, ``retrieval.serve.max_body_bytes`` 1 MiB and
  ``retrieval.serve.timeout_s`` 3 s, the other limits at their defaults): each row sends one bad request
  while 8 well-formed clients search, and reports the answer (status and detail), its time, how many of the
  other clients got their answer with the in-process searcher's ids, and that the service answers
  ``/health`` after it.
* The client (:class:`~raypipe.retrieval.http_client.HttpRetriever`, 0.5 s deadline, 1 retry, batches of 4
  queries, a 1 MiB answer limit) against a server that misbehaves as the row says
  (:mod:`raypipe.testing.http_faults`): 12 questions run by the agent loop with a scripted engine, each
  searching once and answering from its first document. Each row: rows in and out, duplicates, how many
  answered and how many ended ``retrieval_error`` (with the first message, which must be one line), time.

Every row states what it expects; the script exits 1 when a row did not do what it expects.

    python benchmarks/service_faults.py
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from raypipe.core.config import RunConfig, load_config
from raypipe.data.loaders import BUNDLED_CORPUS, Question
from raypipe.retrieval.http_client import HttpRetriever, RetrievalServerError
from raypipe.testing.fakes import FakeEngine
from raypipe.testing.http_faults import FaultyServer, Received, Reply, json_reply, search_r1_answer

PASSAGES = 40
TOKEN = "benchmark-token"
GOOD_CLIENTS = 8
QUESTIONS = 12


@dataclass
class Row:
    cells: list[str]
    expected: bool


def table(title: str, columns: list[str], rows: list[Row]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join([*columns, "as expected"]) + " |")
    print("|" + "---|" * (len(columns) + 1))
    for row in rows:
        cells = [cell.replace("|", "\\|").replace("<", "&lt;") for cell in row.cells]  # Markdown, as printed
        print("| " + " | ".join([*cells, "yes" if row.expected else "**NO**"]) + " |")


# ---- the service ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send(url: str, body: bytes | None, headers: dict[str, str], chunked: bool = False) -> tuple[int, str]:
    """One raw request (``body`` as given, chunked or with a length); its status and a short detail."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=60)
    try:
        if chunked:
            step = 2**16
            chunks = (body[i : i + step] for i in range(0, len(body), step))
            connection.request("POST", parts.path, body=chunks, headers=headers, encode_chunked=True)
        else:
            connection.request("GET" if body is None else "POST", parts.path, body=body, headers=headers)
        response = connection.getresponse()
        raw = response.read()
    except OSError as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    try:
        answer = json.loads(raw)
    except json.JSONDecodeError:
        return response.status, short(raw.decode(errors="replace"))
    if isinstance(answer, dict) and isinstance(answer.get("result"), list):
        return response.status, f"{len(answer['result'][0])} hits"
    detail = answer.get("detail", answer) if isinstance(answer, dict) else answer
    return response.status, short(detail if isinstance(detail, str) else json.dumps(detail))


def short(text: str, limit: int = 150) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def service_rows(work: Path) -> list[Row]:
    import ray

    from raypipe.retrieval import LocalRetriever, encoder_spec
    from raypipe.runtime.index_build import ensure_index
    from raypipe.runtime.serve import deploy_retrieval, undeploy_retrieval

    corpus = work / "corpus.jsonl"
    with BUNDLED_CORPUS.open() as src:
        corpus.write_text("".join(next(src) for _ in range(PASSAGES)))
    config = load_config(
        "embedded",
        [
            f"data.corpus={corpus}",
            f"retrieval.index.dir={work / 'index'}",
            "retrieval.serve.deployment=raypipe-service-faults",
            "retrieval.actors.num_cpus=0",
            "retrieval.serve.max_body_bytes=1048576",
            "retrieval.serve.timeout_s=3",
        ],
    )
    index = ensure_index(config, use_ray=False)
    local = LocalRetriever.open(index, encoder_spec(config.retrieval))
    docs = local.docs.get(range(0, PASSAGES, PASSAGES // GOOD_CLIENTS))
    good = [f"Who is {d.title}?" for d in docs][:GOOD_CLIENTS]
    expected = {q: [h.doc_id for h in r.hits] for q, r in zip(good, local.search_batch(good, 5))}

    ray.init(num_cpus=2, object_store_memory=300_000_000, include_dashboard=False, log_to_driver=False)
    try:
        url = deploy_retrieval(config, index, port=free_port(), token=TOKEN)
        try:
            return [run_bad_request(url, config, case, expected) for case in bad_requests(config)]
        finally:
            undeploy_retrieval(config)
    finally:
        ray.shutdown()


def bad_requests(config: RunConfig) -> list[tuple[str, Callable[[str], tuple[int, str]], int]]:
    """(what is sent, how, the status it must get)."""
    cfg = config.retrieval
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}

    def post(path: str, body: object, headers: dict[str, str] = auth, chunked: bool = False):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return lambda url: send(url + path, data, headers, chunked)

    words = " ".join(["retrieval"] * 400)
    return [
        (
            f"{cfg.serve.max_queries + 1:,} queries in one request",
            post("/retrieve", {"queries": ["q"] * (cfg.serve.max_queries + 1)}),
            413,
        ),
        ("topk 10^12", post("/retrieve", {"queries": ["q"], "topk": 10**12}), 422),
        (
            f"topk {cfg.serve.max_topk:,} on {PASSAGES} passages (all of them come back)",
            post("/retrieve", {"queries": ["q"], "topk": cfg.serve.max_topk}),
            200,
        ),
        ("a 2 MiB body with its Content-Length", post("/retrieve", {"queries": ["x" * 2**21]}), 413),
        ("a 2 MiB body, chunked (no length)", post("/retrieve", {"queries": ["x" * 2**21]}, chunked=True), 413),
        ("malformed JSON", post("/retrieve", b'{"queries": ["unclosed"'), 422),
        ("queries not a list", post("/retrieve", {"queries": "q", "topk": "many"}), 422),
        (
            f"{cfg.serve.max_items + 1:,} ids to /raypipe/doc_vectors",
            post("/raypipe/doc_vectors", {"doc_ids": ["p1"] * (cfg.serve.max_items + 1)}),
            413,
        ),
        ("an unknown lexicon", post("/raypipe/document_frequencies", {"terms": ["a"], "lexicon": "klingon"}), 400),
        ("no token", post("/retrieve", {"queries": ["q"]}, {"Content-Type": "application/json"}), 401),
        ("a wrong token", post("/retrieve", {"queries": ["q"]}, {**auth, "Authorization": "Bearer guess"}), 401),
        (
            "64 texts of 256 tokens to encode (past the 3 s deadline)",
            post("/raypipe/encode_queries", {"texts": [words] * 64}),
            408,
        ),
    ]


def run_bad_request(url: str, config: RunConfig, case, expected: dict[str, list[str]]) -> Row:
    name, request, status = case
    client = HttpRetriever(url, timeout_s=30, retries=0, token=TOKEN)

    def timed() -> tuple[int, str, float]:
        started = time.perf_counter()
        return (*request(url), time.perf_counter() - started)

    with ThreadPoolExecutor(GOOD_CLIENTS + 1) as pool:
        bad = pool.submit(timed)
        time.sleep(0.05)  # the bad request first, the others while it is served
        answers = list(pool.map(lambda q: client.search_batch([q], 5)[0], expected))
        got, detail, seconds = bad.result()
    right = sum([h.doc_id for h in a.hits] == expected[a.query] for a in answers)
    healthy = send(url + "/health", None, {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    return Row(
        [name, f"{got}: {detail}", f"{seconds:.2f}", f"{right}/{len(expected)}", "yes" if healthy else "no"],
        got == status and right == len(expected) and healthy,
    )


# ---- the client ----------------------------------------------------------------------------------------------


def search_then_answer(request):
    """Each question searches for itself once, then answers from what it read."""
    question = request.prompt.split("Question: ")[1].split("?")[0]
    if request.prompt.endswith("<answer>"):
        return f" answer {question} </answer>"
    if "Doc 1(" in request.prompt:
        return f"<think> done </think>\n<answer> answer {question} </answer>"
    return f"<think> look </think>\n<search> {question} </search>"


def run_questions(url: str, config: RunConfig) -> tuple[list[dict], float]:
    from raypipe.agents import build_loop

    client = HttpRetriever(
        url,
        timeout_s=0.5,
        retries=1,
        max_batch_size=4,
        max_wait_ms=20,
        backoff_s=0.05,
        max_response_bytes=2**20,
        token=TOKEN,
    )
    loop = build_loop(config, FakeEngine(search_then_answer), client)
    questions = [
        Question(qid=f"id{i}", dataset="toy", question=f"q{i}?", golden_answers=[f"answer q{i}"])
        for i in range(QUESTIONS)
    ]

    async def run_all():
        return await asyncio.gather(*(loop.run(q) for q in questions))

    started = time.perf_counter()
    outputs = asyncio.run(run_all())
    return [o.trajectory for o in outputs], time.perf_counter() - started


Script = Callable[[Received], Reply]


def after(count: int, then: Script, first: Script) -> Script:
    """``first`` for the first ``count`` requests, ``then`` for the rest."""
    seen = [0]
    lock = threading.Lock()

    def script(request: Received) -> Reply:
        with lock:
            seen[0] += 1
            n = seen[0]
        return first(request) if n <= count else then(request)

    return script


def well(request: Received) -> Reply:
    return json_reply(search_r1_answer(request))


def client_faults() -> list[tuple[str, Callable[[Received], Reply], str, bool]]:
    """(the server, its script, what must happen, whether it stops listening after its first request)."""

    def huge(request: Received) -> Reply:
        answer = search_r1_answer(request)
        answer["padding"] = "x" * 3 * 2**20
        return json_reply(answer)

    def short(request: Received) -> Reply:
        answer = search_r1_answer(request)
        answer["result"] = answer["result"][:-1]
        return json_reply(answer)

    return [
        ("answers well", well, "all", False),
        ("answers after 2 s", lambda r: json_reply(search_r1_answer(r), delay_s=2.0), "none", False),
        ("sends its answer a byte every 20 ms", lambda r: json_reply(search_r1_answer(r), drip_s=0.02), "none", False),
        ("hangs up without answering", lambda r: Reply(hang_up=True), "none", False),
        ("dies after its first answer", well, "some", True),
        (
            "503 for its first request, then well",
            after(1, well, lambda r: Reply(503, b'{"detail": "restarting"}')),
            "all",
            False,
        ),
        ("answers HTML", lambda r: Reply(body=b"<html>\n<h1>502 Bad Gateway</h1>\n</html>"), "none", False),
        ("answers a JSON list", lambda r: json_reply([1, 2, 3]), "none", False),
        ("answers one result list too few", short, "none", False),
        ("answers 3 MiB (the client's limit: 1 MiB)", huge, "none", False),
        ("refuses the token (401)", lambda r: Reply(401, b'{"detail": "wrong token"}'), "none", False),
    ]


def run_client_fault(name: str, script, expect: str, dies: bool, config: RunConfig) -> Row:
    if dies:
        server_box: list[FaultyServer] = []

        def dying(request: Received) -> Reply:
            threading.Thread(target=server_box[0].stop).start()
            return script(request)

        server = FaultyServer(dying)
        server_box.append(server)
    else:
        server = FaultyServer(script)
    try:
        rows, seconds = run_questions(server.url, config)
    finally:
        if not dies:
            server.stop()
    qids = [r["qid"] for r in rows]
    answered = sum(r["stop_reason"] == "answer" and r["final_f1"] == 1.0 for r in rows)
    failed = [r for r in rows if r["stop_reason"] == "retrieval_error"]
    message = failed[0]["error"].replace(server.url, "") if failed else ""
    one_line = all("\n" not in r["error"] for r in failed)
    complete = len(rows) == QUESTIONS and len(set(qids)) == QUESTIONS and answered + len(failed) == QUESTIONS
    share = {"all": answered == QUESTIONS, "none": answered == 0, "some": 0 < answered < QUESTIONS}[expect]
    outcome = f"{answered} answered, {len(failed)} retrieval_error" + (f": {short(message)}" if message else "")
    return Row(
        [
            name,
            outcome,
            str(QUESTIONS),
            str(len(rows)),
            str(len(qids) - len(set(qids))),
            f"{len(server.requests)}",
            f"{seconds:.2f}",
        ],
        complete and share and one_line,
    )


def health_row() -> Row:
    """The job's check before it starts: a /health answering a JSON list stops it with one line."""
    server = FaultyServer(lambda r: json_reply(["ok"]))
    try:
        HttpRetriever(server.url, retries=0).describe()
        outcome, good = "accepted", False
    except RetrievalServerError as exc:
        outcome, good = short(f"{type(exc).__name__}: {exc}".replace(server.url, "")), "\n" not in str(exc)
    finally:
        server.stop()
    return Row(["GET /health answers a JSON list (the job's check at start)", outcome, "-", "-", "-", "1", "-"], good)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="raypipe-service-faults-"))
    try:
        config = load_config("embedded")
        client_rows = [run_client_fault(*case, config) for case in client_faults()] + [health_row()]
        table(
            "The HTTP client against a misbehaving server (12 questions, each searching once)",
            ["the server", "what happened", "rows in", "rows out", "duplicates", "requests", "time s"],
            client_rows,
        )
        server_rows = service_rows(work)
        table(
            f"The service against bad requests ({GOOD_CLIENTS} well-formed searches beside each)",
            ["request", "answer", "its time s", "others answered (in-process ids)", "healthy after"],
            server_rows,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if all(r.expected for r in client_rows + server_rows) else 1)


if __name__ == "__main__":
    main()
