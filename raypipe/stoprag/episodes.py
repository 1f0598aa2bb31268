"""A run's Stop-RAG episodes: each question's states as the Q-network reads them, their rewards and scores.

:func:`load_histories` reads the iterations with their visible documents, :func:`state_rewards` scores every
state with one answer generator (:mod:`raypipe.stoprag.rewards`), :func:`build_episodes` turns them into
:class:`~raypipe.stoprag.targets.Episode` objects and :func:`score_episodes` runs a trained network over them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from raypipe.core.config import EngineConfig, RunConfig, StopRagConfig
from raypipe.core.rundir import RunDir
from raypipe.llm.base import Engine
from raypipe.stoprag.rewards import StateScores, generator_note, generator_rewards, probe_scores, state_documents
from raypipe.stoprag.targets import (
    SEP,
    Episode,
    Margins,
    build_episode,
    rounds_from_history,
    with_documents,
)

log = logging.getLogger(__name__)


def load_histories(run: RunDir, config: RunConfig, qids: set[str]) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Questions and per-qid iteration rows with their visible documents' titles and texts."""
    from raypipe.retrieval.build import corpus_path
    from raypipe.retrieval.store import corpus_documents

    top_k = config.retrieval.top_k  # what the agent saw; a state selects its documents among them
    questions = dict(zip(*run.read("trajectories", ["qid", "question"]).to_pydict().values()))
    rows: dict[str, list[dict]] = {}
    for row in run.read("iterations").to_pylist():
        if row["qid"] in qids:
            rows.setdefault(row["qid"], []).append(row)
    wanted = {d for rs in rows.values() for r in rs if r["iteration"] > 0 for d in (r["doc_ids"] or [])[:top_k]}
    docs = corpus_documents(corpus_path(config.data), wanted)
    return questions, {qid: with_documents(rs, docs, top_k) for qid, rs in rows.items()}


def state_separator(cfg: StopRagConfig) -> str:
    """The Q-network encoder's separator token, which joins a state's parts (the reference's ``[SEP]``)."""
    from raypipe.core.models import resolve_sentence_model
    from raypipe.stoprag.qnet import load_tokenizer

    return load_tokenizer(resolve_sentence_model(cfg.encoder)).sep_token or SEP


def build_episodes(
    config: RunConfig, questions: dict[str, str], histories: dict[str, list[dict]], rewards: dict[str, dict[int, float]]
) -> dict[str, Episode]:
    """Every question's episode: its states as the Q-network reads them and their rewards."""
    cfg = config.stoprag
    sep = state_separator(cfg)
    return {
        qid: build_episode(
            qid,
            questions[qid],
            rows,
            first_decision=cfg.first_decision,
            mode=cfg.state_input,
            doc_chars=cfg.doc_chars,
            per_round=cfg.docs_per_iteration,
            sep=sep,
            rewards=rewards[qid],
        )
        for qid, rows in histories.items()
    }


def state_rewards(
    run: RunDir,
    config: RunConfig,
    questions: dict[str, str],
    histories: dict[str, list[dict]],
    engine_factory: Callable[[EngineConfig], Engine],
    out: Path,
) -> tuple[dict[str, StateScores], str]:
    """qid -> every state's reward and the same answers' exact match (:mod:`raypipe.stoprag.rewards`), and
    the note that names the generator. The generator's answers go to ``rewards.parquet``."""
    cfg = config.stoprag
    golden = dict(zip(*run.read("trajectories", ["qid", "golden_answers"]).to_pydict().values()))
    if cfg.reward_source == "probe":
        if not any(r.get("probe_answer") is not None for rows in histories.values() for r in rows):
            raise ValueError("the run has no probed answers (agent.probe=false?): use stoprag.reward_source=generator")
        rule = run.metric_rule()  # the rule the recorded probe F1 was scored by
        scores = {qid: probe_scores(rows, golden[qid], rule) for qid, rows in histories.items()}
        return scores, generator_note(cfg, config.engine.model)
    states = {}
    for qid, rows in histories.items():
        rounds = rounds_from_history(rows)
        for it in range(len(rounds) + 1):
            states[(qid, it)] = (questions[qid], state_documents(rounds[:it], cfg.docs_per_iteration))
    log.info("rewards: %d states x %d answers from the docs-only final-answer prompt", len(states), cfg.reward_samples)
    engine = engine_factory(config.engine)
    try:
        started = time.perf_counter()
        scores, rows = asyncio.run(generator_rewards(engine, states, golden, cfg, config.agent.metric, config.seed))
        log.info("rewards: generated in %.1f s", time.perf_counter() - started)
    finally:
        asyncio.run(engine.close())
    pd.DataFrame(rows).to_parquet(out / "rewards.parquet")
    return scores, generator_note(cfg, config.engine.model)


def score_episodes(folder: Path, episodes: Sequence[Episode]) -> tuple[Margins, list[dict]]:
    """Q_stop, Q_cont and the margin of every state, at the network's own input length and truncation."""
    from raypipe.stoprag.qnet import QNetwork, load_tokenizer, score

    net, meta = QNetwork.load(folder)
    texts = [t for ep in episodes for t in ep.texts]
    q_stop, q_cont = score(net, load_tokenizer(folder), texts, meta["max_length"], keep=meta["state_truncation"])
    margins: Margins = {}
    rows, k = [], 0
    for ep in episodes:
        for it, reward in zip(ep.iterations, ep.rewards):
            margins.setdefault(ep.qid, {})[it] = q_stop[k] - q_cont[k]
            rows.append({"qid": ep.qid, "iteration": it, "reward": reward, "q_stop": q_stop[k], "q_cont": q_cont[k]})
            k += 1
    return margins, rows
