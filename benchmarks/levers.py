"""The engine's speed levers, each against the default on the same questions: generation wall, engine steps, and
the agent transcripts compared with the default's.

A lever is a named set of raypipe engine settings (``--set`` keys, recorded in a run's ``config.yaml``); ``together``
combines the ones that do not exclude each other. For every repeat, in alternating order (forward, backward, ...),
each lever starts its own engine (timed apart from the run), runs the stage over the questions (``probe`` in
``benchmarks/probe.py``: the main job's generation actor body, its prefix cache emptied first) and closes the
engine. Printed per lever: the generation wall (median and range over the repeats), trajectories/min, the ratio of
the default's wall to the lever's in the same repeat (above 1: the lever is faster), the engine's steps and
milliseconds per step, its start, and how many agent transcripts equal the default's in the same repeat
(``--show-differences``: where each differing one first differs, to tell numeric near-ties from real changes).

    python benchmarks/levers.py [--config PRESET] [--set KEY=VALUE ...] [--limit N] [--repeats 1]
        [--levers default,ngram-4,...] [--show-differences]

``float32`` runs only where the default dtype is another (a CPU with native bfloat16, a GPU); ``compiled`` pays its
compile at its first start (the start column), which a later start loads from the compile cache.
"""

from __future__ import annotations

import logging
import time

from probe import (
    ASYNC_ENGINE,
    Engines,
    Result,
    differing,
    median,
    open_index,
    run_variant,
    spread,
    step_summary,
    transcript_differences,
)

from raypipe.core.config import RunConfig
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.machine import cpu_description
from raypipe.data.loaders import load_datasets

log = logging.getLogger("benchmarks.levers")

DEFAULT = "default"
LEVERS: dict[str, tuple[str, ...]] = {
    DEFAULT: (),
    "ngram-4": ("engine.speculative_ngram_tokens=4",),  # prompt-lookup speculative decoding, no draft model
    "batched-4096": ("engine.max_num_batched_tokens=4096",),
    "no-chunked-prefill": ("engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=4096"),
    "block-64": ("engine.block_size=64",),
    "seqs-16": ("engine.max_num_seqs=16",),
    "compiled": ("engine.enforce_eager=false",),
    "vllm-threads": ("engine.cpu_threads=null",),  # vLLM's own thread binding (one core kept for its frontend)
    "float32": ("engine.dtype=float32",),
}
TOGETHER = ("ngram-4", "batched-4096", "block-64", "seqs-16", "compiled")
LEVERS["together"] = tuple(setting for name in TOGETHER for setting in LEVERS[name])


def default_is_float32(config: RunConfig) -> bool:
    import torch

    from raypipe.llm.common import resolve_dtype

    return resolve_dtype(config.engine.dtype, on_cpu=not torch.cuda.is_available()) == "float32"


def run_lever(name: str, repeat: int, config: RunConfig, questions, index) -> tuple[Result, float]:
    """One run of the stage on an engine of its own: (the run, the engine's start in seconds)."""
    engines = Engines(config)
    try:
        engine = engines.get(ASYNC_ENGINE)
        result = run_variant("probe", repeat, config, questions, engine, index)
    finally:
        engines.close()
    result.name = name
    return result, engines.starts[ASYNC_ENGINE][0]


def print_report(runs: dict[str, list[tuple[Result, float]]], show_differences: bool) -> None:
    model, flags, cores = cpu_description()
    print(f"\nCPU: {model}; {cores} cores; flags: {flags}")
    defaults = [result for result, _ in runs[DEFAULT]]
    questions = defaults[0].questions
    print(f"{questions} questions, {len(defaults)} repeats; the default against each lever in the same repeat\n")
    head = (
        f"{'lever':<20}{'wall s':>8}{'(range)':>13}{'traj/min':>10}{'default/lever':>17}{'steps':>8}"
        f"{'ms/step':>9}{'start s':>9}{'same transcripts':>18}"
    )
    print(head)
    print("-" * len(head))
    for name, pairs in runs.items():
        results = [result for result, _ in pairs]
        walls = [r.wall_s for r in results]
        speedups = [d.wall_s / r.wall_s for d, r in zip(defaults, results)]
        steps = [r.counters["steps"] for r in results if r.counters]
        per_step = [r.wall_s / s * 1000 for r, s in zip(results, steps)]
        same = [questions - differing(d, r) for d, r in zip(defaults, results)] if name != DEFAULT else []
        print(
            f"{name:<20}{median(walls):>8.1f}{spread(walls):>13}{median([r.per_min for r in results]):>10.1f}"
            f"{median(speedups):>7.2f}x {spread(speedups, '.2f'):>9}{median(steps):>8.0f}{median(per_step):>9.1f}"
            f"{median([start for _, start in pairs]):>9.1f}"
            f"{', '.join(f'{n}/{questions}' for n in same) or '(reference)':>18}"
        )
    print("\n(wall: the stage's generation over all questions; start: the engine's, apart from it)")
    if len(defaults) > 1:
        counts = [differing(defaults[0], r) for r in defaults[1:]]
        print(
            "agent transcripts that differ between repeats of the default (batch numerics): "
            f"{', '.join(map(str, counts))} of {questions}"
        )
    for name, pairs in runs.items():
        results = [result for result, _ in pairs]
        if results[0].counters:
            print(f"engine steps, {name}: {step_summary(results)}")
    if show_differences:
        for name, pairs in runs.items():
            for default, (result, _) in zip(defaults, pairs):
                for d in transcript_differences(default, result) if name != DEFAULT else []:
                    where = f"iteration {d.iteration}" if d.iteration is not None else "the transcript (rows agree)"
                    print(
                        f"  {name}, repeat {result.repeat}, {d.qid}, first differs at {where}:\n"
                        f"    {'default:':<12}{d.a!r}\n    {name + ':':<12}{d.b!r}"
                    )


def main() -> None:
    parser = job_parser(__doc__)
    parser.add_argument("--limit", type=int, help="questions per dataset (default: the config's data.limit)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every lever, in alternating order")
    parser.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated subset of {', '.join(LEVERS)}")
    parser.add_argument(
        "--show-differences",
        action="store_true",
        help="list where each agent transcript that differs from the default's first differs",
    )
    args = parser.parse_args()
    names = [name for name in args.levers.split(",") if name]
    if set(names) - set(LEVERS):
        parser.error(f"--levers takes names from {', '.join(LEVERS)}")
    setup_logging(args.verbose)
    extra = [f"data.limit={args.limit}", "data.limit_files=true"] if args.limit else []
    config = config_from_args(args, extra)
    if "float32" in names and default_is_float32(config):
        print("float32: left out, the default engine already computes in float32 here")
        names.remove("float32")
    names = [DEFAULT, *(name for name in names if name != DEFAULT)]  # every lever is compared with the default
    configs = {name: config_from_args(args, [*extra, *LEVERS[name]]) for name in names}
    questions = load_datasets(config.data.datasets, config.data.limit, config.data.limit_files)

    index = open_index(config)
    runs: dict[str, list[tuple[Result, float]]] = {name: [] for name in names}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            runs[name].append(run_lever(name, repeat, configs[name], questions, index))
            result, start = runs[name][-1]
            log.info("%s (repeat %d): engine start %.1f s, run %.1f s", name, repeat, start, result.wall_s)
    print_report(runs, args.show_differences)
    print(f"\nall runs: {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
