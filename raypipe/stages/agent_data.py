"""The agent-data job (``raypipe agent-data``, ``python jobs/agent_data.py``): supervised agent trajectories.

The work is Ray-free (:mod:`raypipe.agenttrain.trajectories`): the bundled questions are split
(:mod:`raypipe.data.split`), and every training question's trajectory is planned with the run config's
own retriever over its index (built if missing, in this process) and rendered through the agent loop.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from raypipe.agenttrain.trajectories import run_build, write_outputs
from raypipe.core.jobargs import config_from_args, job_parser, setup_logging
from raypipe.core.models import resolve_llm
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
"""

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("out", metavar="OUT", help="the output folder")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N training questions of each dataset")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    config = config_from_args(args)
    if config.data.corpus != "bundled":
        raise SystemExit("error: agent-data works on the bundled questions and corpus (data.corpus=bundled)")
    started = time.monotonic()
    split = bundled_split(config.agent_train.dev_percent)
    questions = split.train
    if args.limit:
        questions = first_per_dataset(questions, args.limit)
    index = ensure_index(config, use_ray=False)
    retriever = LocalRetriever.open(index, encoder_spec(config.retrieval), search_params(config.retrieval))
    corpus = {p.doc_id: p for p in load_corpus(BUNDLED_CORPUS)}
    tokenizer = LocalTokenizer(resolve_llm(config.engine.model))
    built = time.monotonic()

    def progress(done: int, total: int) -> None:
        if done % 50 == 0 or done == total:
            rate = done / max(time.monotonic() - built, 1e-9)
            log.info("%d/%d questions, %.1f/s, ETA %.0f s", done, total, rate, (total - done) / rate)

    kept, rejected = run_build(questions, config, retriever, corpus, tokenizer, progress)
    split_info = {
        "rule": f"default: the first {DEFAULT_RUN_LIMIT} questions of each bundled dataset; dev: other qids with "
        f"int(sha256(qid)[:8], 16) % 100 < {config.agent_train.dev_percent}; train: the rest",
        **{part: split.qids(part) for part in ("default", "dev", "train")},
        "used": [q.qid for q in questions],
    }
    summary = write_outputs(Path(args.out), kept, rejected, split_info)
    print(
        f"{summary['kept']} trajectories kept of {summary['questions']} training questions "
        f"({summary['rejected']} rejected: {summary['rejected_by_reason']}); searches {summary['searches']}; "
        f"{time.monotonic() - started:.0f} s; in {args.out}"
    )
