"""What one decision of the online controller costs on this CPU, part by part: the predictor bundle's load, then per
decision the unsupervised signals (the feature extractor behind its memories), each cross-encoder's forward and the
heads, against an iteration's engine time in the run the decisions come from.

    python benchmarks/decision_parts.py --bundle RUN/models --run DEV_RUN [--limit 60] [--repeats 3] [--set ...]

The decisions are replayed from a recorded run (``--run``, a ``raypipe probe`` directory: its iterations with the
documents the agent saw, as the online history carries them) in the order the controller meets them: iteration 1
of every trajectory, then iteration 2 of those that went on, and so on. Each round is decided twice: as one batch
(the micro-batcher's case, every trajectory of the round waiting at once) and one trajectory per call. Each repeat
starts from fresh memories and an empty score cache; the load is timed once, each part as the controller does it
(``stopping.crossencoder_backend`` and ``stopping.sentence_backend``; an ONNX export on first use is part of it).
Prints the CPU, the load of each part in seconds, and per decision each part's milliseconds (median and range over
the repeats), with the run's mean engine seconds of an iteration beside them (summed over overlapping requests, as
the iterations table records them: the ratio says what a decision costs against an iteration's engine work, not
what it adds to wall time).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller_probe import spread  # the median [range] over repeats, as the batch job's benchmark prints it

from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.machine import cpu_description
from raypipe.core.rundir import RunDir

History = tuple[list[dict[str, Any]], str]


class Stopwatch:
    """Seconds spent in named parts, summed over the calls of each."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def timed(self, part: str, call: Callable) -> Callable:
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started

        return run


class Timed:
    """An object whose ``method`` calls are timed as ``part`` (a scorer's ``score``, a head's ``predict``)."""

    def __init__(self, inner: Any, method: str, part: str, watch: Stopwatch):
        self.inner = inner
        setattr(self, method, watch.timed(part, getattr(inner, method)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def decision_rounds(
    histories: Mapping[str, Sequence[Mapping[str, Any]]], questions: Mapping[str, str]
) -> list[list[History]]:
    """The decisions of a run as the controller meets them: round i holds, for every trajectory that reached
    retrieval iteration i, its history up to i (iteration 0 included)."""
    ordered = {qid: sorted(rows, key=lambda r: int(r["iteration"])) for qid, rows in histories.items()}
    last = max((int(rows[-1]["iteration"]) for rows in ordered.values() if rows), default=0)
    return [
        [
            ([dict(r) for r in rows if int(r["iteration"]) <= i], questions[qid])
            for qid, rows in ordered.items()
            if any(int(r["iteration"]) == i for r in rows)
        ]
        for i in range(1, last + 1)
    ]


def per_decision_ms(seconds: Mapping[str, float], decisions: int) -> dict[str, float]:
    """Each part's milliseconds per decision, and ``rest``: the decision's time no part accounts for."""
    parts = {part: s * 1000 / decisions for part, s in seconds.items() if part != "decision"}
    return {**parts, "rest": seconds["decision"] * 1000 / decisions - sum(parts.values())}


def main() -> None:
    parser = job_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, help="a predictor bundle (raypipe train): RUN/models")
    parser.add_argument("--run", required=True, help="a probe run whose iterations are replayed as decisions")
    parser.add_argument("--limit", type=int, default=60, help="trajectories replayed (the run's first)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.limit < 1 or args.repeats < 1:
        parser.error("--limit and --repeats take at least 1")
    setup_logging(args.verbose)
    config = config_from_args(args)

    from raypipe.features.resources import IndexCorpus
    from raypipe.predict.bundle import PredictorBundle
    from raypipe.predict.scorers import load_scorer
    from raypipe.stopping.online import bundle_folder, memo_feature_extractor, sentence_encoder
    from raypipe.stoprag.episodes import load_histories

    run = RunDir(args.run)
    qids = run.read("trajectories", ["qid"]).column("qid").to_pylist()[: args.limit]
    questions, histories = load_histories(run, config, set(qids))
    rounds = decision_rounds(histories, questions)
    decisions = sum(len(r) for r in rounds)
    engine_s = [
        s for it, s in zip(*run.read("iterations", ["iteration", "engine_s"]).to_pydict().values()) if it >= 1 and s
    ]

    stopping = config.stopping
    load = Stopwatch()
    loaded = load.timed("heads (manifest, pickles)", PredictorBundle.load)(bundle_folder(args.bundle))
    corpus = sentences = None
    if loaded.needs_feature_extractor:
        corpus = load.timed("index and corpus (QPP, overlap)", IndexCorpus.open)(config)
        sentences = load.timed(f"sentence encoder ({stopping.sentence_backend})", sentence_encoder)(config)
    columns = [c for c in loaded.sup_models if c in loaded.feature_columns]
    scorers = {}
    for column in columns:
        scorers[column] = load.timed(f"cross-encoder {column} ({stopping.crossencoder_backend})", load_scorer)(
            loaded.root / loaded.sup_models[column],
            stopping.crossencoder_backend,
            threads=stopping.crossencoder_threads,
        )

    runs: dict[str, list[dict[str, float]]] = {"batched": [], "one by one": []}
    for _ in range(args.repeats):
        for mode, calls in runs.items():
            watch = Stopwatch()
            bundle = PredictorBundle(  # fresh memories and score cache: every text is met for the first time
                loaded.root,
                loaded.manifest,
                heads={k: Timed(h, "predict", "heads", watch) for k, h in loaded.heads.items()},
                feature_extractor=None
                if corpus is None or sentences is None
                else watch.timed("features", memo_feature_extractor(config, corpus, sentences)),
                scorers={c: Timed(scorer, "score", c, watch) for c, scorer in scorers.items()},
            )
            predict = watch.timed("decision", bundle.predict_many)
            for decided in rounds:
                for batch in [decided] if mode == "batched" else [[h] for h in decided]:
                    predict(batch)
            calls.append(per_decision_ms(watch.seconds, decisions))

    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}, {cores} logical cores, flags: {flags or 'no AVX2/AVX-512/AMX flags'}")
    print(
        f"bundle {args.bundle} ({loaded.feature_group}, w={loaded.window}, {len(columns)} cross-encoders on "
        f"{stopping.crossencoder_backend}); run "
        f"{args.run}: {decisions} decisions of {len(qids)} trajectories in {len(rounds)} rounds; "
        f"{args.repeats} repeats\n"
    )
    print(f"{'load, once per process':<44} {'s':>8}")
    for part, s in load.seconds.items():
        print(f"  {part:<42} {s:>8.2f}")
    print(f"  {'total':<42} {sum(load.seconds.values()):>8.2f}\n")

    parts = [*(["features"] if corpus is not None else []), *columns, "heads", "rest"]
    print(f"{'per decision, ms: median [range]':<44} {'batched':>22} {'one by one':>22}")
    for part in [*parts, "decision"]:
        cells = [
            spread([sum(c.values()) if part == "decision" else c.get(part, 0.0) for c in calls], ".1f")
            for calls in runs.values()
        ]
        print(f"  {part:<42} {cells[0]:>22} {cells[1]:>22}")
    if engine_s:
        iteration_ms = statistics.fmean(engine_s) * 1000
        shares = [statistics.median(sum(c.values()) for c in calls) / iteration_ms for calls in runs.values()]
        print(
            f"\nan iteration's engine time in the run: mean {iteration_ms:.0f} ms over {len(engine_s)} iterations; "
            f"a decision over it: {shares[0]:.1%} batched, {shares[1]:.1%} one by one"
        )


if __name__ == "__main__":
    main()
