"""Load benchmark of ``raypipe serve-agent``: open-loop clients at several request rates, natural stopping against
policies that stop early, on one replica.

The application runs on a local Ray (the config's engine, the embedded default unless ``--config``/``--set`` say
otherwise; retrieval as ``retrieval.backend`` says), one replica. For each rate (``--rates``, requests per
minute) and each policy, requests arrive as a Poisson process (seeded: the same arrival times for every policy
at a rate) over the bundled questions (``--questions``, taken round robin over the datasets), each sent when
it arrives whatever is still in flight (an open loop: a slow server gets a queue, not fewer requests). Before
each run the engine's prefix cache is emptied (no run inherits another's). Policies: ``natural``; ``capK``
(Cap@k with ``--cap K``: a saving that is certain whatever the predictors are worth); ``heuristic`` (the
4-state heuristic on the predictor bundle ``--bundle PATH`` from ``raypipe train``, thresholds
``stopping.theta_p``/``theta_u``), left out, and said so, without a bundle.

It prints one row per rate and policy: requests answered (and refused: 429/503), answers per minute over the
run (first arrival to last answer), latency p50/p95/p99, retrieval iterations, generated and prefilled tokens
per answer, F1 (golden answers are sent), and the saving against natural at the same rate in iterations,
generated tokens and p50 latency; then the CPU. With the embedded SmolLM2-135M the figures check the
machinery, not the science.

    python benchmarks/serve_agent.py [--rates 2,4,8] [--questions 8] [--cap 1] [--bundle PATH] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from dataclasses import dataclass, field
from itertools import zip_longest

import httpx
from first_run import cpu_description  # benchmarks/first_run.py, beside this script

from raypipe.core.config import RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.data.loaders import Question, load_datasets

log = logging.getLogger("benchmarks.serve_agent")


@dataclass
class Run:
    rate: float
    policy: str
    latencies: list[float] = field(default_factory=list)
    answers: list[dict] = field(default_factory=list)
    refused: int = 0
    failed: int = 0
    wall_s: float = 0.0

    def per_answer(self, key) -> float:
        return statistics.fmean(key(a) for a in self.answers) if self.answers else float("nan")

    def percentile(self, q: int) -> float:
        if len(self.latencies) < 2:
            return self.latencies[0] if self.latencies else float("nan")
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[q - 1]


def questions_round_robin(config: RunConfig, n: int) -> list[Question]:
    by_dataset = [load_datasets([name], n) for name in config.data.datasets]
    return [q for group in zip_longest(*by_dataset) for q in group if q is not None][:n]


def arrivals(rate_per_min: float, n: int, seed: int) -> list[float]:
    """Seconds from the start at which each of ``n`` requests arrives (Poisson process at ``rate_per_min``)."""
    rng, at, out = random.Random(seed), 0.0, []
    for _ in range(n):
        at += rng.expovariate(rate_per_min / 60)
        out.append(at)
    return out


async def open_loop(url: str, questions: list[Question], policy: dict, rate: float, seed: int, name: str) -> Run:
    run = Run(rate, name)
    times = arrivals(rate, len(questions), seed)
    async with httpx.AsyncClient(timeout=None) as client:
        started = time.monotonic()

        async def one(question: Question, at: float) -> None:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            sent = time.monotonic()
            reply = await client.post(f"{url}/v1/answer", json={
                "question": question.question, "golden_answers": question.golden_answers, "dataset": question.dataset,
                "policy": policy})  # fmt: skip
            if reply.status_code == 200:
                run.latencies.append(time.monotonic() - sent)
                run.answers.append(reply.json())
            elif reply.status_code in (429, 503):
                run.refused += 1
            else:
                run.failed += 1
                log.warning("%s at %g/min: HTTP %d %s", name, rate, reply.status_code, reply.text[:200])

        await asyncio.gather(*(one(q, at) for q, at in zip(questions, times)))
        run.wall_s = time.monotonic() - started - times[0]
    return run


def saving(mine: float, natural: float) -> str:
    return f"{(1 - mine / natural) * 100:+.0f}%" if natural else "-"


def print_table(runs: list[Run]) -> None:
    header = (f"{'rate/min':>8} {'policy':<10} {'answered':>8} {'refused':>7} {'ans/min':>7} {'p50 s':>6} {'p95 s':>6} "
              f"{'p99 s':>6} {'iters':>5} {'gen tok':>7} {'prefill':>7} {'F1':>5}  "
              "saving vs natural: iters / tokens / p50")  # fmt: skip
    print(header)
    print("-" * len(header))
    natural = {r.rate: r for r in runs if r.policy == "natural"}
    for r in runs:
        iters = r.per_answer(lambda a: a["iterations"])
        tokens = r.per_answer(lambda a: a["cost"]["generated_tokens"])
        prefill = r.per_answer(lambda a: a["cost"]["prefilled_tokens"] or 0)
        f1 = r.per_answer(lambda a: a["f1"] or 0.0)
        base = natural.get(r.rate)
        saved = "" if base is None or r is base else " / ".join((
            saving(iters, base.per_answer(lambda a: a["iterations"])),
            saving(tokens, base.per_answer(lambda a: a["cost"]["generated_tokens"])),
            saving(r.percentile(50), base.percentile(50))))  # fmt: skip
        print(f"{r.rate:>8g} {r.policy:<10} {len(r.answers):>8} {r.refused:>7} {len(r.answers) / r.wall_s * 60:>7.2f} "
              f"{r.percentile(50):>6.1f} {r.percentile(95):>6.1f} {r.percentile(99):>6.1f} {iters:>5.2f} "
              f"{tokens:>7.1f} {prefill:>7.1f} {f1:>5.3f}  {saved}")  # fmt: skip


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("--rates", default="2,4,8", help="request rates per minute, comma-separated (default 2,4,8)")
    parser.add_argument("--questions", type=int, default=8, help="questions per run, round robin over the datasets")
    parser.add_argument("--cap", type=int, default=1, help="k of the Cap@k policy (default 1)")
    parser.add_argument("--bundle", metavar="PATH", help="predictor bundle (raypipe train): adds the heuristic policy")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    args = parser.parse_args()
    setup_logging(args.verbose)
    config = config_from_args(args)
    rates = [float(r) for r in args.rates.split(",") if r]
    questions = questions_round_robin(config, args.questions)
    policies = [("natural", {"name": "natural"}), (f"cap{args.cap}", {"name": "cap", "k": args.cap})]
    if args.bundle:
        policies.append(("heuristic", {"name": "heuristic"}))

    from ray import serve

    from raypipe.runtime.cluster import init_ray
    from raypipe.runtime.retrieval import open_retrieval
    from raypipe.runtime.serve_agent import deploy_agent, undeploy_agent
    from raypipe.stages.serve_agent import bundle_paths

    init_ray(config)
    controller, _ = bundle_paths(config, args.bundle, None)
    started = time.monotonic()
    retrieval = open_retrieval(config)
    url = deploy_agent(config, retrieval, port=args.port, controller=controller)
    start_s = time.monotonic() - started
    handle = serve.get_app_handle(config.serve_agent.deployment)
    runs = []
    try:
        for i, rate in enumerate(rates):
            for name, policy in policies if i % 2 == 0 else policies[::-1]:  # alternate the order between rates
                handle.reset_prefix_cache.remote().result()
                log.info("%s at %g requests/min over %d questions", name, rate, len(questions))
                runs.append(asyncio.run(open_loop(url, questions, policy, rate, args.seed + i, name)))
    finally:
        undeploy_agent(config)
        retrieval.shutdown()
    runs.sort(key=lambda r: (r.rate, [p for p, _ in policies].index(r.policy)))

    model, flags, cores = cpu_description()
    print(f"\n{len(questions)} questions ({', '.join(config.data.datasets)}) per run, Poisson arrivals "
          f"(seed {args.seed}), "
          f"one replica (max_in_flight {config.serve_agent.max_in_flight}); model {config.engine.model} on "
          f"{config.engine.backend}, protocol {config.agent.protocol}, max_turns {config.agent.max_turns}; "
          f"service start (engine and retrieval) {start_s:.0f} s\n")  # fmt: skip
    print_table(runs)
    if not args.bundle:
        print("\nheuristic policy: not run (no --bundle PATH: a predictor bundle from `raypipe train`)")
    print(f"\nCPU: {model}, {cores} logical cores, {flags or 'no AVX2/AVX-512/AMX flags'}")
    if config.engine.model == "smollm2":
        print("The embedded SmolLM2-135M checks the machinery, not the science: its answers and the controller's "
              "predictions are near noise; Cap@k's saving is the certain one.")  # fmt: skip


if __name__ == "__main__":
    main()
