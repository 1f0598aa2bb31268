"""LLM-Stop as a baseline on Stop-RAG's test questions: the run's engine judges every decision point.

The verdicts become margins (1 stop, 0 continue) replayed like the Q-network's; the controller and its
prompt and parsers are :mod:`raypipe.stoprag.llm_stop`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from raypipe.core.config import EngineConfig, RunConfig
from raypipe.llm.base import Engine
from raypipe.llm.factory import build_engine
from raypipe.stopping.caps import natural
from raypipe.stopping.replay import Trajectory
from raypipe.stoprag.comparison import comparison_rows
from raypipe.stoprag.llm_stop import LLMStopController, judge_prefixes
from raypipe.stoprag.targets import Margins, margin_controller, rounds_from_history

log = logging.getLogger(__name__)


def llm_stop_margins(
    config: RunConfig,
    questions: dict[str, str],
    histories: dict[str, list[dict]],
    test_t: list[Trajectory],
    engine_factory: Callable[[EngineConfig], Engine] = build_engine,
) -> tuple[Margins, list[dict]]:
    """Run LLM-Stop through the engine on every decision point of the test trajectories (all at
    once, so the engine batches them); its verdicts become margins 1 (stop) / 0 (continue)."""
    cfg = config.stoprag
    items = []
    for t in test_t:
        rounds = rounds_from_history(histories[t.qid])
        for it in range(max(cfg.first_decision, 1), t.n_iterations):
            items.append((t.qid, it, questions[t.qid], rounds[:it]))
    log.info("LLM-Stop: %d decision prompts for %d test questions", len(items), len(test_t))
    engine = engine_factory(config.engine)
    try:
        controller = LLMStopController(
            engine,
            max_tokens=cfg.llm_stop_max_tokens,
            temperature=cfg.llm_stop_temperature,
            docs=cfg.llm_stop_docs,
            doc_chars=cfg.doc_chars,
            default=cfg.llm_stop_default,
            first_decision=cfg.first_decision,
            seed=config.seed,
            enforce=cfg.llm_stop_enforce,
            parser=cfg.llm_stop_parser,
        )
        if cfg.llm_stop_enforce:  # compile the grammar before the real requests
            asyncio.run(engine.warmup([controller.regex]))
        started = time.perf_counter()
        judged = asyncio.run(judge_prefixes(controller, items))
        log.info("LLM-Stop: judged in %.1f s", time.perf_counter() - started)
    finally:
        asyncio.run(engine.close())
    margins: Margins = {t.qid: {} for t in test_t}
    rows = []
    for qid, per_it in judged.items():
        for it, (parsed, raw) in per_it.items():
            margins[qid][it] = 1.0 if parsed.verdict == "stop" else 0.0
            rows.append(
                {"qid": qid, "iteration": it, "verdict": parsed.verdict, "source": parsed.source, "output": raw}
            )
    return margins, rows


def llm_stop_comparison(
    config: RunConfig,
    questions: dict[str, str],
    histories: dict[str, list[dict]],
    test_t: list[Trajectory],
    engine_factory: Callable[[EngineConfig], Engine],
    out: Path,
) -> tuple[list[dict], list[dict]]:
    """LLM-Stop's summary rows and outcomes on the first ``stoprag.llm_stop_max_questions`` test questions
    (with natural stopping on the same questions when they are fewer than all); raw outputs to llm_stop.parquet."""
    cfg = config.stoprag
    subset = test_t[: cfg.llm_stop_max_questions]
    margins, llm_rows = llm_stop_margins(config, questions, histories, subset, engine_factory)
    pd.DataFrame(llm_rows).to_parquet(out / "llm_stop.parquet")
    sources = pd.Series([r["source"] for r in llm_rows]).value_counts().to_dict() if llm_rows else {}
    note = f"{config.engine.model}{', enforced' if cfg.llm_stop_enforce else ''}; parsed by: " + ", ".join(
        f"{k} {v}" for k, v in sorted(sources.items())
    )
    rows, outcomes = comparison_rows(subset, {"llm_stop": (margin_controller(margins, 0.5, "llm_stop"), note)})
    if len(subset) < len(test_t):
        nat, _ = comparison_rows(subset, {"natural (LLM-Stop questions)": (natural, "")})
        rows = nat + rows
    return rows, outcomes
