"""Retrieval benchmark: encode speed, index build time, search throughput, recall@k and index memory.

For each encoder (--encoders, default the configured one; ``minilm@none`` / ``minilm@int8`` pick the
quantisation) it reuses the index a job with that encoder uses, or builds it, over the configured corpus:
after ``make run`` the default encoder's is the one that command built, from the vectors shipped for the
bundled corpus (the "index vectors" row says so, and no encoding figures come from its manifest).
--force rebuilds by encoding (shipped vectors off) and so times an encoding's build; otherwise the build
times recorded in the manifest are shown. Then it measures on this machine:
  - passages/s encoding a sample of the corpus in-process (wall clock, and per CPU-second of this
    process, which is steadier on a shared machine; the load average is printed beside them), the
    build's own encoder CPU-seconds from the manifest and what they make on 2 idle cores, and for a
    quantised encoder the cosine of its passage vectors to fp32's on the sample,
  - queries/s of the in-process retriever at batch 1 (the sequential baseline), 32 and 256 (k = deep_k),
    and of the Ray service with 64 concurrent single-query callers (coalesced into batches),
  - recall@3 / @10 of the supporting paragraphs (title match) with the original questions as queries,
  - the FAISS index's memory (its serialised size) and the doc store's size on disk.

``--service-paths`` instead compares the ways a job can reach retrieval on the configured index, at 1, 8
and 64 concurrent clients (each sends one single-query search after another; k = deep_k): queries/s
and p50/p99 latency of the in-job actor service, of the Serve deployment (``raypipe serve-retrieval``)
through raypipe's HTTP client (which coalesces a job's concurrent searches into batched POSTs), and of
the deployment with independent outside clients (one POST per query: Serve's request batching alone).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

from raypipe.core.config import ConfigError, RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.data.loaders import load_corpus, load_datasets
from raypipe.retrieval.build import encoder_spec, search_params
from raypipe.retrieval.encoders import EncoderSpec, passage_text
from raypipe.retrieval.evaluate import dataset_recall
from raypipe.retrieval.index import DOCSTORE_FILE, RetrievalIndexError, load_index_dir, vector_source
from raypipe.retrieval.searcher import LocalRetriever
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.index_build import ensure_index
from raypipe.runtime.retrieval import start_retrieval_service

log = logging.getLogger("benchmarks.retrieval")


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def search_rate(retriever: LocalRetriever, queries: list[str], batch: int, k: int, budget_s: float = 20.0) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget_s:
        chunk = [queries[(done + i) % len(queries)] for i in range(batch)]
        retriever.search_batch(chunk, k)
        done += batch
        if done >= 2 * len(queries):
            break
    return done / (time.perf_counter() - start)


def service_rate(config: RunConfig, index_path, queries: list[str], k: int, callers: int = 64) -> float:
    client = start_retrieval_service(config, index_path)
    try:

        async def burst(qs):
            return await asyncio.gather(*(client.search([q], k) for q in qs))

        asyncio.run(burst(queries[:8]))  # warm-up
        qs = [queries[i % len(queries)] for i in range(4 * callers)]
        start = time.perf_counter()
        for offset in range(0, len(qs), callers):
            asyncio.run(burst(qs[offset : offset + callers]))
        return len(qs) / (time.perf_counter() - start)
    finally:
        client.shutdown()


CLIENTS = (1, 8, 64)


async def closed_loop(search, queries: list[str], clients: int, k: int, seconds: float) -> dict:
    """``clients`` callers, each searching one query after another for ``seconds``; ``search(c, qs, k)``
    is caller ``c``'s call. Returns queries/s and the p50/p99 latency of one call in ms."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def caller(c: int) -> None:
        i = c
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await search(c, [queries[i % len(queries)]], k)
            latencies.append(time.perf_counter() - started)
            i += clients

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(clients)))
    wall = time.perf_counter() - started
    ms = sorted(1000 * x for x in latencies)
    return {"qps": len(ms) / wall, "p50": ms[len(ms) // 2], "p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))]}


def bench_service_paths(config: RunConfig, args) -> list[dict]:
    """The in-job actor service against the Serve deployment, on the same queries (see the module docstring)."""
    from raypipe.retrieval.http_client import HttpRetriever
    from raypipe.runtime.serve import deploy_retrieval, undeploy_retrieval

    cfg = config.retrieval
    path = ensure_index(config)
    texts = [q.question for q in load_datasets(config.data.datasets, args.limit)]
    seconds = args.service_seconds

    async def measure_all(name: str, search) -> dict:  # one event loop: a client's batcher lives in it
        await closed_loop(search, texts, 8, cfg.deep_k, 1.0)  # warm-up
        row = {"path": name}
        for clients in CLIENTS:
            row[clients] = await closed_loop(search, texts, clients, cfg.deep_k, seconds)
            log.info("%s, %d clients: %.0f q/s", name, clients, row[clients]["qps"])
        return row

    def measure(name: str, search) -> dict:
        return asyncio.run(measure_all(name, search))

    actors = start_retrieval_service(config, path)
    try:
        rows = [measure("in-job actor service", lambda c, qs, k: actors.search(qs, k))]
    finally:
        actors.shutdown()
    url = deploy_retrieval(config, path, port=args.port)
    try:
        job_client = HttpRetriever.from_config(
            cfg.model_copy(update={"http": cfg.http.model_copy(update={"url": url})})
        )
        rows.append(measure("Serve deployment, raypipe HTTP client", lambda c, qs, k: job_client.search(qs, k)))
        outside = [
            HttpRetriever(url, cfg.http.timeout_s, cfg.http.retries, max_batch_size=1, max_wait_ms=0)
            for _ in range(max(CLIENTS))
        ]
        rows.append(measure("Serve deployment, one POST per query", lambda c, qs, k: outside[c].search(qs, k)))
    finally:
        undeploy_retrieval(config)
    return rows


def print_service_table(rows: list[dict], passages: int) -> None:
    print(f"retrieval paths, {passages} passages, k = deep_k, single-query searches; q/s and p50 / p99 ms per call\n")
    head = "| path | " + " | ".join(f"{c} client{'s' if c > 1 else ''}" for c in CLIENTS) + " |"
    print(head)
    print("|---" * (len(CLIENTS) + 1) + "|")
    for row in rows:
        cells = [f"{row[c]['qps']:.0f} q/s, {row[c]['p50']:.1f} / {row[c]['p99']:.1f} ms" for c in CLIENTS]
        print(f"| {row['path']} | " + " | ".join(cells) + " |")
    base = rows[0][max(CLIENTS)]["qps"]
    for row in rows[1:]:
        print(
            f"\n{row['path']}: {row[max(CLIENTS)]['qps'] / base:.2f}x the in-job throughput at {max(CLIENTS)} clients"
        )


def bench_config(base: RunConfig, encoder: str, force: bool) -> RunConfig:
    """The configuration of one encoder's column: ``base`` with ``encoder`` (NAME or NAME@QUANTIZATION).

    Its index is the one a job with that encoder uses (for the default encoder, ``make run``'s, whichever
    vectors it holds). ``force``: the index is rebuilt by encoding (shipped vectors off), so the build's
    figures are an encoding's."""
    update: dict[str, object] = {"encoder": encoder}
    if "@" in encoder:  # minilm@none / minilm@int8: the encoder with that retrieval.encoder_quantization
        update["encoder"], update["encoder_quantization"] = encoder.split("@", 1)
    if force:
        update["encode"] = base.retrieval.encode.model_copy(update={"shipped_vectors": False})
    return base.model_copy(update={"retrieval": base.retrieval.model_copy(update=update)})


def bench_encoder(base: RunConfig, encoder: str, args) -> dict:
    config = bench_config(base, encoder, args.force)
    cfg = config.retrieval
    log.info("%s: building or reusing the index", encoder)
    path, build_wall, _ = timed(lambda: ensure_index(config, force=args.force, use_ray=not args.no_ray))
    idx = load_index_dir(path, encoder_spec(cfg))
    build = idx.manifest.get("build", {})
    spec = encoder_spec(cfg)
    row = {
        "encoder": spec.name,
        "variant": f"{spec.resolved_backend} {spec.resolved_quantization}",
        "vectors": vector_source(idx.manifest),
        "passages": idx.manifest["count"],
        "encode_cpu_s": build.get("encode_cpu_seconds"),
        "build_s": build_wall
        if args.force
        else sum(v for k, v in build.items() if k.endswith("_seconds") and k != "encode_cpu_seconds"),
        "build_from": "this run" if args.force else "manifest",
        "encode_s": build.get("encode_seconds"),
    }
    encoder_obj, row["encoder_load_s"], _ = timed(lambda: encoder_spec(cfg, threads=args.threads).load())
    sample = [passage_text(p.title, p.text) for p in load_corpus(idx.manifest["corpus"])[: args.sample]]
    encoder_obj.encode_passages(sample[:16])  # warm-up
    _, wall, cpu = timed(lambda: encoder_obj.encode_passages(sample))
    row["passages_per_s"] = len(sample) / wall
    row["passages_per_cpu_s"] = len(sample) / cpu
    row["load"] = os.getloadavg()[0]
    if spec.resolved_quantization != "none":  # how far the quantised passage vectors are from fp32's
        exact = EncoderSpec(**{**spec.__dict__, "quantization": "none", "backend": "auto", "threads": args.threads})
        cos = (exact.load().encode_passages(sample) * encoder_obj.encode_passages(sample)).sum(1)
        row["cosine"] = f"{cos.mean():.4f} (min {cos.min():.3f})"

    retriever = LocalRetriever(idx, encoder_obj, search_params(cfg))
    questions = load_datasets(config.data.datasets, args.limit)
    texts = [q.question for q in questions]
    results = retriever.search_batch(texts, 10)
    row["recall"] = dataset_recall(questions, results, ks=(3, 10))
    for batch in (1, 32, 256):
        row[f"qps@{batch}"] = search_rate(retriever, texts, batch, cfg.deep_k)
    if not (args.no_service or args.no_ray):
        row["qps_service"] = service_rate(config, path, texts, cfg.deep_k)

    import faiss

    row["index_bytes"] = len(faiss.serialize_index(retriever.index))
    row["docstore_bytes"] = (path / idx.manifest.get("docstore", DOCSTORE_FILE)).stat().st_size
    row["index_type"] = idx.manifest["factory"]
    return row


def print_table(rows: list[dict]) -> None:
    names = [r["encoder"] for r in rows]
    width = max(20, *(len(n) + 2 for n in names))
    lines = [f"{'':<38}" + "".join(f"{n:>{width}}" for n in names)]

    def add(label, values):
        lines.append(f"{label:<38}" + "".join(f"{v:>{width}}" for v in values))

    add("passages", [r["passages"] for r in rows])
    add("FAISS index", [r["index_type"] for r in rows])
    add("passage encoder (backend, weights)", [r["variant"] for r in rows])
    add("index vectors", [r["vectors"] for r in rows])
    add("passage vectors: cosine to fp32", [r.get("cosine", "1 (fp32)") for r in rows])
    add("sample: passages/s (wall)", [f"{r['passages_per_s']:.1f}" for r in rows])
    add("sample: passages per CPU-second", [f"{r['passages_per_cpu_s']:.1f}" for r in rows])
    add("sample: load average (1 min)", [f"{r['load']:.1f}" for r in rows])
    add("index build s (" + rows[0]["build_from"] + ")", [f"{r['build_s']:.0f}" for r in rows])
    add("  of which encoding s", [f"{r['encode_s'] or 0:.0f}" for r in rows])
    add("  encoder CPU-s (build)", [f"{r['encode_cpu_s']:.0f}" if r["encode_cpu_s"] else "-" for r in rows])
    add(
        "  passages per CPU-s (build)",
        [f"{r['passages'] / r['encode_cpu_s']:.1f}" if r["encode_cpu_s"] else "-" for r in rows],
    )
    add(
        "  encoder CPU-min / 2 cores", [f"{r['encode_cpu_s'] / 2 / 60:.1f}" if r["encode_cpu_s"] else "-" for r in rows]
    )
    for batch in (1, 32, 256):
        add(f"search q/s, batch {batch} (in-process)", [f"{r[f'qps@{batch}']:.0f}" for r in rows])
    if "qps_service" in rows[0]:
        add("search q/s, service, 64 callers", [f"{r['qps_service']:.0f}" for r in rows])
    datasets = sorted({d for r in rows for d in r["recall"]})
    for dataset in datasets:
        for k in (3, 10):
            add(f"recall@{k} {dataset}", [f"{r['recall'].get(dataset, {}).get(f'recall@{k}', 0):.3f}" for r in rows])
    add("index memory MB", [f"{r['index_bytes'] / 1e6:.1f}" for r in rows])
    add("doc store MB (Parquet)", [f"{r['docstore_bytes'] / 1e6:.1f}" for r in rows])
    print("\n".join(lines))


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument(
        "--encoders",
        default=None,
        help="comma-separated encoders, NAME or NAME@QUANTIZATION (minilm@none,minilm@int8); "
        "default: retrieval.encoder",
    )
    parser.add_argument("--sample", type=int, default=1024, help="passages encoded to measure encode speed")
    parser.add_argument("--limit", type=int, default=None, help="questions per dataset for recall (default all)")
    parser.add_argument("--threads", type=int, default=None, help="encoder threads (default: library default)")
    parser.add_argument("--force", action="store_true", help="rebuild the indexes (times the build)")
    parser.add_argument("--no-service", action="store_true", help="skip the Ray service measurement")
    parser.add_argument("--no-ray", action="store_true", help="build in-process and skip the service (no Ray)")
    parser.add_argument(
        "--service-paths",
        action="store_true",
        help="only compare the in-job actor service with the Serve deployment at 1, 8, 64 clients",
    )
    parser.add_argument("--service-seconds", type=float, default=10.0, help="measuring time per path and client count")
    parser.add_argument("--port", type=int, default=8000, help="the deployment's HTTP port (--service-paths)")
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)
    encoders = args.encoders.split(",") if args.encoders else [config.retrieval.encoder]

    import ray

    if not args.no_ray:
        init_ray(config)
    try:
        if args.service_paths:
            rows = bench_service_paths(config, args)
            passages = load_index_dir(ensure_index(config)).manifest["count"]
        else:
            rows = [bench_encoder(config, encoder, args) for encoder in encoders]
    except (ConfigError, FileNotFoundError, RetrievalIndexError) as exc:  # e.g. an index built otherwise: one line
        sys.exit(f"error: {exc}")
    finally:
        ray.shutdown()
    print()
    if args.service_paths:
        print_service_table(rows, passages)
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
