"""The agent-data job (``raypipe agent-data``, ``python jobs/agent_data.py``): supervised agent trajectories.

The work is Ray-free (:mod:`raypipe.agenttrain.trajectories`): the bundled questions are split
(:mod:`raypipe.data.split`), and every training question's trajectory is planned with the run config's
own retriever over its index (built if missing, in this process) and rendered through the agent loop. With
``--from-run`` the trajectories are a probe run's own successful ones on training questions (a second round's
data, :mod:`raypipe.agenttrain.own_samples`), replayed through the same loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from raypipe.agenttrain.own_samples import RUN_COLUMNS, own_trajectories
from raypipe.agenttrain.trajectories import run_build, write_outputs
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.models import resolve_llm
from raypipe.core.rundir import RunDir
from raypipe.data.loaders import BUNDLED_CORPUS, load_corpus
from raypipe.data.split import DEFAULT_RUN_LIMIT, bundled_split, first_per_dataset
from raypipe.llm.common import LocalTokenizer
from raypipe.retrieval import LocalRetriever, encoder_spec, search_params
from raypipe.runtime.index_build import ensure_index

DESCRIPTION = """Make supervised agent trajectories from the bundled training questions (docs/agent-training.md).

Splits the bundled questions into the default run's (data.limit per dataset), a fixed dev split (by a hash of each
qid, agent_train.dev_percent) and the training pool; for each training question plans searches with the retriever
until its supporting paragraphs are shown, renders them through the agent loop in the preset's protocol, and writes
OUT/trajectories.jsonl and .parquet, OUT/rejected.parquet, OUT/split.json and OUT/summary.json/.md.

With --from-run RUN: the trajectories of a probe run on training questions (--set data.split=train) that ended
with their own answer at final F1 >= --min-f1, replayed through the agent loop (rejection sampling: the data of
a second round, tune-agent --set agent_train.init_adapter=...).
"""

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("out", metavar="OUT", help="the output folder")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N training questions of each dataset")
    parser.add_argument("--from-run", metavar="RUN", help="a probe run on training questions: its own trajectories")
    parser.add_argument(
        "--min-f1", type=float, default=1.0, help="with --from-run: keep trajectories with this final F1 or more"
    )
    args = parser.parse_args(argv)
    if args.from_run is not None and args.limit:
        parser.error("--limit chooses training questions to plan; --from-run takes the run's own questions")
    setup_logging(args.verbose)
    config = config_from_args(args)
    if config.data.corpus != "bundled":
        raise SystemExit("error: agent-data works on the bundled questions and corpus (data.corpus=bundled)")
    started = time.monotonic()
    split = bundled_split(config.agent_train.dev_percent)
    questions = split.train
    if args.limit:
        questions = first_per_dataset(questions, args.limit)
    run_rows = None if args.from_run is None else training_run_rows(args.from_run, split.qids("train"))
    index = ensure_index(config, use_ray=False)
    retriever = LocalRetriever.open(index, encoder_spec(config.retrieval), search_params(config.retrieval))
    tokenizer = LocalTokenizer(resolve_llm(config.engine.model))
    built = time.monotonic()

    def progress(done: int, total: int) -> None:
        if done % 50 == 0 or done == total:
            rate = done / max(time.monotonic() - built, 1e-9)
            log.info("%d/%d questions, %.1f/s, ETA %.0f s", done, total, rate, (total - done) / rate)

    if run_rows is None:
        corpus = {p.doc_id: p for p in load_corpus(BUNDLED_CORPUS)}
        kept, rejected = run_build(questions, config, retriever, corpus, tokenizer, progress)
        used = [q.qid for q in questions]
    else:
        by_qid = {q.qid: q for q in split.train}
        kept, rejected = asyncio.run(
            own_trajectories(by_qid, run_rows, config, retriever, tokenizer, args.min_f1, progress)
        )
        used = [r["qid"] for r in run_rows]
    split_info = {
        "rule": f"default: the first {DEFAULT_RUN_LIMIT} questions of each bundled dataset; dev: other qids with "
        f"int(sha256(qid)[:8], 16) % 100 < {config.agent_train.dev_percent}; train: the rest",
        **{part: split.qids(part) for part in ("default", "dev", "train")},
        "used": used,
        **({} if args.from_run is None else {"from_run": str(args.from_run), "min_f1": args.min_f1}),
    }
    summary = write_outputs(Path(args.out), kept, rejected, split_info)
    print(
        f"{summary['kept']} trajectories kept of {summary['questions']} training questions "
        f"({summary['rejected']} rejected: {summary['rejected_by_reason']}); searches {summary['searches']}; "
        f"{time.monotonic() - started:.0f} s; in {args.out}"
    )


def training_run_rows(run: str, train_qids: list[str]) -> list[dict]:
    """The trajectories of probe run ``run``; refused unless every question is in the training pool."""
    rows = RunDir(run).read("trajectories", columns=RUN_COLUMNS).to_pylist()
    outside = sorted({r["qid"] for r in rows} - set(train_qids))
    if outside:
        raise SystemExit(
            f"error: {run} asked {len(outside)} questions outside the training pool (dev or default-run questions, "
            f"e.g. {outside[0]}); make it with `raypipe probe --set data.split=train`"
        )
    if not rows:
        raise SystemExit(f"error: {run} has no trajectories")
    return rows
