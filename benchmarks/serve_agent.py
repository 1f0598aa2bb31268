"""Load benchmark of ``raypipe serve-agent`` at saturation: closed-loop clients, then open-loop arrivals past the
measured capacity; natural stopping against policies that stop early, on one replica.

The application runs on a local Ray (the config's engine, the embedded default unless ``--config``/``--set`` say
otherwise; retrieval as ``retrieval.backend`` says), one replica. Every point sends ``--requests`` requests (default
40) over the bundled questions (the part ``data.split`` names, taken round robin over the datasets, ``--questions``
distinct ones, cycled), and is run ``--repeats`` times (default 3), the policies in alternating order; the engine's
prefix cache is emptied before each run (no run inherits another's).

* closed loop (``--clients``, default 1,4,16): that many clients, each sending its next request when its last is
  answered, so the replica always holds that many;
* open loop (``--load-factors``, default 0.5,1,1.5, times the policy's capacity: the highest median throughput of
  its closed-loop points; or ``--rates`` in requests per minute for every policy): requests arrive as a seeded
  Poisson process and each is sent when it arrives whatever is still in flight (a slow server gets a queue, and
  past its capacity refusals (429/503), not fewer requests).

Policies: ``natural``; ``capK`` (Cap@k with ``--cap K``: a saving that is certain whatever the predictors are
worth); ``heuristic`` (the 4-state heuristic on the predictor bundle ``--bundle PATH`` from ``raypipe train``)
and ``stoprag`` (the Q-network ``--stoprag PATH``), each left out, and said so, without its file.

Throughput is measured over a steady-state window (:func:`steady_window`): from the completion that ends the
warm-up (the first ``--warmup`` share of the requests, default 10%) to the last request sent (after it only the
drain is left); answers completed in the window per minute of it. Each row gives, over the repeats, the median
and range of the throughput and of the latency percentiles of each repeat; a percentile is shown only where a
repeat has enough answers to support it (:func:`supported`: p50 needs 2, p95 20, p99 100). Per answer:
retrieval iterations, generated and prefilled tokens, F1 (golden answers are sent), over all repeats. The CPU's
model and instruction-set flags are printed with the table. With the embedded SmolLM2-135M the figures check the
machinery, not the science.

    python benchmarks/serve_agent.py [--clients 1,4,16] [--load-factors 0.5,1,1.5 | --rates R,...] [--requests 40]
        [--repeats 3] [--questions 40] [--cap 1] [--bundle PATH] [--stoprag PATH] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import cycle, islice, zip_longest

import httpx

from raypipe.core.config import RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.machine import cpu_description
from raypipe.core.models import embedded_llm_note
from raypipe.data.loaders import Question
from raypipe.data.split import run_questions

log = logging.getLogger("benchmarks.serve_agent")

MIN_REQUESTS, MIN_REPEATS = 40, 3  # fewer per point: a smoke run, not a measurement


@dataclass
class Request:
    """One request of a run: when it was sent and came back (seconds from the run's start), and its answer."""

    sent: float
    done: float
    status: int  # HTTP status: 200 answered, 429/503 refused
    answer: dict | None = None

    @property
    def answered(self) -> bool:
        return self.status == 200


@dataclass
class Run:
    """One repeat of one point (a closed loop of ``clients``, or an open loop at ``rate`` per minute) for a policy."""

    mode: str  # "closed" or "open"
    load: float  # clients, or requests per minute
    policy: str
    repeat: int
    requests: list[Request] = field(default_factory=list)

    @property
    def answers(self) -> list[dict]:
        return [r.answer for r in self.requests if r.answered]

    @property
    def latencies(self) -> list[float]:
        return [r.done - r.sent for r in self.requests if r.answered]

    @property
    def refused(self) -> int:
        return sum(r.status in (429, 503) for r in self.requests)

    @property
    def failed(self) -> int:
        return sum(not r.answered and r.status not in (429, 503) for r in self.requests)


def steady_window(requests: list[Request], warmup: float) -> tuple[float, float] | None:
    """The run's steady state: from the completion that ends the warm-up to the last request sent; None where that
    leaves no time.

    The warm-up is the first ceil(``warmup`` x requests) completions (answered or refused): the replica fills and
    its caches warm. With no warm-up the window starts at the first request sent. After the last request is sent
    no new load arrives, and what is still in flight drains with fewer and fewer requests in the replica (a closed
    loop's clients stop one by one), so the window ends there."""
    if not requests:
        return None
    skip = math.ceil(warmup * len(requests))
    start = sorted(r.done for r in requests)[skip - 1] if skip else min(r.sent for r in requests)
    end = max(r.sent for r in requests)
    return (start, end) if end > start else None


def throughput(requests: list[Request], window: tuple[float, float] | None) -> float | None:
    """Answers per minute completed inside the window (after its start, up to and including its end)."""
    if window is None:
        return None
    start, end = window
    return sum(r.answered and start < r.done <= end for r in requests) / (end - start) * 60


def supported(q: float, samples: int) -> bool:
    """Whether ``samples`` values support a ``q``-th percentile: at least 100 / (100 - q) of them, so that at
    least one value lies at or above it (p50: 2, p95: 20, p99: 100)."""
    return samples >= math.ceil(100 / (100 - q) - 1e-9)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (linear between order statistics), None where :func:`supported` says too few."""
    if not supported(q, len(values)):
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q / 100
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def arrivals(rate_per_min: float, n: int, seed: int) -> list[float]:
    """Seconds from the start at which each of ``n`` requests arrives (Poisson process at ``rate_per_min``)."""
    rng, at, out = random.Random(seed), 0.0, []
    for _ in range(n):
        at += rng.expovariate(rate_per_min / 60)
        out.append(at)
    return out


def open_loop_rates(capacity_per_min: float, factors: list[float]) -> list[float]:
    """The open loop's rates: the closed loop's measured capacity times each factor (1 and above: at and past it)."""
    return [capacity_per_min * f for f in factors]


def median_range(values: list[float | None], fmt: str) -> str:
    """'median (min-max)' of the values shown (None: not supported in a repeat); '-' if none is."""
    shown = [v for v in values if v is not None]
    if not shown:
        return "-"
    mid = f"{statistics.median(shown):{fmt}}"
    spread = f" ({min(shown):{fmt}}-{max(shown):{fmt}})" if len(shown) > 1 else ""
    partial = "" if len(shown) == len(values) else f" [{len(shown)}/{len(values)}]"
    return mid + spread + partial


Send = Callable[[Question], Awaitable[tuple[int, dict | None]]]


async def closed_loop(send: Send, questions: list[Question], clients: int, clock=time.monotonic) -> list[Request]:
    """``clients`` clients share the questions; each sends the next when its last came back."""
    todo = iter(questions)
    out: list[Request] = []
    started = clock()

    async def client() -> None:
        for question in todo:
            sent = clock() - started
            status, answer = await send(question)
            out.append(Request(sent, clock() - started, status, answer))

    await asyncio.gather(*(client() for _ in range(clients)))
    return out


async def open_loop(send: Send, questions: list[Question], times: list[float], clock=time.monotonic) -> list[Request]:
    """Each question sent at its arrival time (seconds from the start), whatever is still in flight."""
    out: list[Request] = []
    started = clock()

    async def one(question: Question, at: float) -> None:
        await asyncio.sleep(max(0.0, started + at - clock()))
        sent = clock() - started
        status, answer = await send(question)
        out.append(Request(sent, clock() - started, status, answer))

    await asyncio.gather(*(one(q, at) for q, at in zip(questions, times)))
    return out


def sender(client: httpx.AsyncClient, url: str, policy: dict, name: str) -> Send:
    async def send(question: Question) -> tuple[int, dict | None]:
        reply = await client.post(
            f"{url}/v1/answer",
            json={
                "question": question.question,
                "golden_answers": question.golden_answers,
                "dataset": question.dataset,
                "policy": policy,
            },
        )
        if reply.status_code not in (200, 429, 503):
            log.warning("%s: HTTP %d %s", name, reply.status_code, reply.text[:200])
        return reply.status_code, reply.json() if reply.status_code == 200 else None

    return send


def questions_round_robin(config: RunConfig, n: int) -> list[Question]:
    """The first ``n`` questions of the run's part (``data.split``: ``--set data.split=dev`` keeps the questions a
    tuned agent and a predictor bundle never saw), taken round robin over its datasets."""
    part = run_questions(config.data.model_copy(update={"limit": n}), config.agent_train.dev_percent)
    by_dataset = [[q for q in part if q.dataset == name] for name in config.data.datasets]
    return [q for group in zip_longest(*by_dataset) for q in group if q is not None][:n]


def saving(mine: float | None, natural: float | None, higher_is_better: bool = False) -> str:
    if mine is None or not natural:
        return "-"
    change = mine / natural - 1 if higher_is_better else 1 - mine / natural
    return f"{change * 100:+.0f}%"


def middle(values: list[float | None]) -> float | None:
    """The median of the values shown (None where none is)."""
    shown = [v for v in values if v is not None]
    return statistics.median(shown) if shown else None


def per_answer(runs: list[Run], key) -> float:
    values = [key(a) for r in runs for a in r.answers]
    return statistics.fmean(values) if values else float("nan")


def print_table(runs: list[Run], warmup: float) -> None:
    points: dict[tuple[str, float, str], list[Run]] = {}
    for r in runs:
        points.setdefault((r.mode, r.load, r.policy), []).append(r)

    def rate(group: list[Run]) -> list[float | None]:
        return [throughput(r.requests, steady_window(r.requests, warmup)) for r in group]

    def p(group: list[Run], q: float) -> list[float | None]:
        return [percentile(r.latencies, q) for r in group]

    header = (
        f"{'loop':<6} {'load':>9} {'policy':<10} {'sent':>11} {'answered':>11} {'refused':>9} "
        f"{'answers/min':>18} {'p50 s':>17} {'p95 s':>17} {'p99 s':>17} {'iters':>5} {'gen tok':>7} "
        f"{'prefill':>7} {'F1':>5}  vs natural: ans/min / p50"
    )
    print(header)
    print("-" * len(header))
    for (mode, load, policy), group in points.items():
        natural = points.get((mode, load, "natural"))
        vs = ""
        if natural is not None and natural is not group:
            vs = (
                f"{saving(middle(rate(group)), middle(rate(natural)), True)} / "
                f"{saving(middle(p(group, 50)), middle(p(natural, 50)))}"
            )
        where = f"{load:g} clients" if mode == "closed" else f"{load:.2f}/min"
        print(
            f"{mode:<6} {where:>9} {policy:<10} {median_range([len(r.requests) for r in group], '.0f'):>11} "
            f"{median_range([len(r.answers) for r in group], '.0f'):>11} "
            f"{median_range([r.refused for r in group], '.0f'):>9} {median_range(rate(group), '.2f'):>18} "
            f"{median_range(p(group, 50), '.1f'):>17} {median_range(p(group, 95), '.1f'):>17} "
            f"{median_range(p(group, 99), '.1f'):>17} {per_answer(group, lambda a: a['iterations']):>5.2f} "
            f"{per_answer(group, lambda a: a['cost']['generated_tokens']):>7.1f} "
            f"{per_answer(group, lambda a: a['cost']['prefilled_tokens'] or 0):>7.1f} "
            f"{per_answer(group, lambda a: a['f1'] or 0.0):>5.3f}  {vs}"
        )
    failed = sum(r.failed for r in runs)
    print(
        f"\n(median (range) over repeats; answers/min over the steady-state window: from the completion that ends "
        f"the first {warmup:.0%} of the requests to the last request sent; a percentile of one repeat's latencies "
        "only where it has enough answers (p50 >= 2, p95 >= 20, p99 >= 100), [k/n]: shown in k of n repeats; "
        f"iterations, tokens and F1 per answer over all repeats; failed requests: {failed})"
    )


def capacity(runs: list[Run], policy: str, warmup: float) -> float | None:
    """The policy's capacity: the highest median throughput of its closed-loop points."""
    best = None
    for load in sorted({r.load for r in runs if r.mode == "closed" and r.policy == policy}):
        rates = [
            throughput(r.requests, steady_window(r.requests, warmup))
            for r in runs
            if r.mode == "closed" and r.policy == policy and r.load == load
        ]
        rates = [x for x in rates if x is not None]
        if rates and (best is None or statistics.median(rates) > best):
            best = statistics.median(rates)
    return best


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("--clients", default="1,4,16", help="closed-loop clients per point, comma-separated")
    parser.add_argument(
        "--load-factors",
        default="0.5,1,1.5",
        help="open-loop rates as multiples of the policy's closed-loop capacity, comma-separated",
    )
    parser.add_argument("--rates", help="open-loop rates per minute for every policy instead of --load-factors")
    parser.add_argument("--requests", type=int, default=MIN_REQUESTS, help="requests per point and repeat")
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help="runs of every point and policy")
    parser.add_argument(
        "--questions", type=int, default=MIN_REQUESTS, help="distinct questions, cycled over the requests"
    )
    parser.add_argument("--warmup", type=float, default=0.1, help="share of a run's requests left out as warm-up")
    parser.add_argument("--cap", type=int, default=1, help="k of the Cap@k policy (default 1)")
    parser.add_argument("--bundle", metavar="PATH", help="predictor bundle (raypipe train): adds the heuristic policy")
    parser.add_argument(
        "--stoprag", metavar="PATH", help="Stop-RAG Q-network (raypipe stoprag): adds the stoprag policy"
    )
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--seed", type=int, default=0, help="seed of the open loop's arrival times")
    args = parser.parse_args()
    if args.requests < 1 or args.repeats < 1 or not 0 <= args.warmup < 1:
        parser.error("--requests and --repeats take at least 1, --warmup a share in [0, 1)")
    setup_logging(args.verbose)
    config = config_from_args(args)
    questions = list(islice(cycle(questions_round_robin(config, args.questions)), args.requests))
    policies = [("natural", {"name": "natural"}), (f"cap{args.cap}", {"name": "cap", "k": args.cap})]
    if args.bundle:
        policies.append(("heuristic", {"name": "heuristic"}))
    if args.stoprag:
        policies.append(("stoprag", {"name": "stoprag"}))

    from ray import serve

    from raypipe.runtime.cluster import init_ray
    from raypipe.runtime.retrieval import open_retrieval
    from raypipe.runtime.serve_agent import deploy_agent, undeploy_agent
    from raypipe.stages.serve_agent import bundle_paths

    init_ray(config)
    controller, stoprag = bundle_paths(config, args.bundle, args.stoprag)
    started = time.monotonic()
    retrieval = open_retrieval(config)
    url = deploy_agent(config, retrieval, port=args.port, controller=controller, stoprag=stoprag)
    start_s = time.monotonic() - started
    handle = serve.get_app_handle(config.serve_agent.deployment)
    runs: list[Run] = []

    def one_run(mode: str, load: float, name: str, policy: dict, repeat: int, seed: int) -> Run:
        handle.reset_prefix_cache.remote().result()  # outside the clients' event loop: a blocking call
        return asyncio.run(load_run(mode, load, name, policy, repeat, seed))

    async def load_run(mode: str, load: float, name: str, policy: dict, repeat: int, seed: int) -> Run:
        log.info("%s loop at %g, %s, repeat %d: %d requests", mode, load, name, repeat, len(questions))
        async with httpx.AsyncClient(timeout=None) as client:
            send = sender(client, url, policy, name)
            if mode == "closed":
                requests = await closed_loop(send, questions, int(load))
            else:
                requests = await open_loop(send, questions, arrivals(load, len(questions), seed))
        return Run(mode, load, name, repeat, requests)

    try:
        turn = 0
        for repeat in range(args.repeats):
            for clients in floats(args.clients):
                for name, policy in policies if turn % 2 == 0 else policies[::-1]:
                    runs.append(one_run("closed", clients, name, policy, repeat, 0))
                turn += 1
        rates: dict[str, list[float]] = {}
        for name, _ in policies:
            cap = capacity(runs, name, args.warmup)
            if args.rates:
                rates[name] = floats(args.rates)
            else:
                rates[name] = open_loop_rates(cap, floats(args.load_factors)) if cap else []
        for repeat in range(args.repeats):
            for i in range(max(map(len, rates.values()), default=0)):
                for name, policy in policies if turn % 2 == 0 else policies[::-1]:
                    if i < len(rates[name]):
                        seed = args.seed + 1000 * repeat + i  # the same arrivals for every policy at a point
                        runs.append(one_run("open", rates[name][i], name, policy, repeat, seed))
                turn += 1
    finally:
        undeploy_agent(config)
        retrieval.shutdown()
    order = [p for p, _ in policies]
    runs.sort(key=lambda r: (r.mode != "closed", r.load if r.mode == "closed" else 0, order.index(r.policy), r.load))

    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}, {cores} logical cores, flags: {flags or 'no AVX2/AVX-512/AMX flags'}")
    print(
        f"{args.requests} requests per point ({len({q.qid for q in questions})} distinct questions of "
        f"{', '.join(config.data.datasets)}, split {config.data.split}), {args.repeats} repeats; "
        f"open loop: Poisson arrivals (seed {args.seed}) "
        + (f"at {args.rates} per minute" if args.rates else f"at {args.load_factors} x each policy's capacity")
        + f"; one replica (max_in_flight {config.serve_agent.max_in_flight}, max_queued "
        f"{config.serve_agent.max_queued}); model {config.engine.model} on {config.engine.backend}, protocol "
        f"{config.agent.protocol}, max_turns {config.agent.max_turns}; service start (engine and retrieval) "
        f"{start_s:.0f} s\n"
    )
    if args.requests < MIN_REQUESTS or args.repeats < MIN_REPEATS:
        print(f"SMOKE RUN, NOT A MEASUREMENT: fewer than {MIN_REQUESTS} requests per point or {MIN_REPEATS} repeats\n")
    print_table(runs, args.warmup)
    for name in order:
        cap = capacity(runs, name, args.warmup)
        print(f"capacity of {name} (highest median closed-loop answers/min): {'-' if cap is None else f'{cap:.2f}'}")
    if not args.bundle:
        print("heuristic policy: not run (no --bundle PATH: a predictor bundle from `raypipe train`)")
    if not args.stoprag:
        print("stoprag policy: not run (no --stoprag PATH: a Q-network from `raypipe stoprag`)")
    if note := embedded_llm_note(config.engine.model, config.engine.adapter):
        print(f"note: {note}; Cap@k's saving is the certain one.")


if __name__ == "__main__":
    main()
