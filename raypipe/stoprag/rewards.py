"""Stop-RAG's rewards: one answer generator scores every state, the terminal one included.

The reference scores each partial trace with one final-answer generator (chosolbee/MHQA-SetVerify
``Training/preprocessing/compute_metrics.py`` l.68-100: ``--repeat-size 8`` answers per state, their mean
EM/F1; ``--fag-temperature`` 0.0 and ``--fag-max-gen-length`` 400 by default), the last state of a trace
like any other. Two generators here (``stoprag.reward_source``):

- ``probe`` (default): the agent's own probed answer at every iteration, recorded by jobs/probe.py
  (greedy, one answer): what an online controller returns when it stops there;
- ``generator``: the reference's docs-only final-answer prompt (:data:`FINAL_ANSWER_DOCS_PROMPT`,
  ``compute_metrics.py`` with ``--use-docs-only``, as the reference README trains) over the question and
  the state's documents, through the run's engine: ``reward_samples`` answers at ``reward_temperature``
  (the paper's mean over N = 8 sampled answers), scored by the run's F1 rule.

Each state's :class:`StateScores` hold the reward (the answers' mean F1) and the same answers' mean exact
match, under the same ``agent.metric`` rule. The comparison table scores every controller with them
(:func:`rescore`): stopping at a state returns that state's answer, and natural termination is the terminal
state's, not the agent's own final answer -- in F1 and in EM alike, so the EM and F1 columns (and their
paired tests) score one answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from raypipe.core.config import StopRagConfig
from raypipe.core.metrics import Rule, exact_match, f1_score
from raypipe.llm.base import Engine, EngineError, GenerationRequest
from raypipe.stopping.replay import Trajectory
from raypipe.stoprag.targets import Round, probe_rewards, selected_documents

# chosolbee/MHQA-SetVerify pipeline/answer_generator/prompts.py l.336-383
# (FINAL_ANSWER_GENERATION_DOCS_SYSTEM_PROMPT), verbatim.
FINAL_ANSWER_DOCS_PROMPT = """
Given an original question and a series of documents, generate the final answer to the original question.

Process:
- You receive:
    - Main question: <original question>
    - One or more documents in the format:
      - Document: <Wikipedia snippet>

- Your task:
    1. Focus on answering the original question.
    2. Use all provided documents as evidence to connect information across passages.
    3. Output only the final answer, with no additional text. The answer should be a single word or a short phrase (no full sentences).

Output only the process after the given prompt. Do not repeat the given prompt in your response.

Here are some examples:

#
## Input
Main question: What is the major railroad museum located in the location where Andre Bloc lived at his time of death?

Document: André Bloc (Algiers, May 23, 1896 – New Delhi, November 8, 1966) was a French sculptor, magazine editor, and founder of several specialist journals. He founded the "Groupe Espace" in 1949.
Document: New Delhi is home to Indira Gandhi Memorial Museum, National Gallery of Modern Art, National Museum of Natural History, National Rail Museum, National Handicrafts and Handlooms Museum, National Philatelic Museum, Nehru Planetarium, Shankar's International Dolls Museum. and Supreme Court of India Museum.
## Output
National Rail Museum

#
## Input
Main question: What is the least popular official language in the country where a spiral viaduct is located in Karin Thomas' birthplace?

Document: Karin Thomas (born 3 October 1961 in Brusio) was a Swiss cross country skier who competed from 1982 to 1988.
Document: Brusio spiral viaduct: A signature structure of the World Heritage-listed Bernina railway, it is located near Brusio, in the Canton of Graubünden, Switzerland.
Document: Switzerland has four official languages: principally German (63.5% total population share), French (22.5%) in the west; and Italian (8.1%) in the south. The fourth official language, Romansh (0.5%), is a Romance language spoken locally in the southeastern trilingual canton of Graubünden.
## Output
Romansh

#
## Input
Main question: When did hurricane Sandy hit the city where The Dealers' performer was born?

Document: The Dealers is a 1964 album by jazz musician Mal Waldron released on Status Records, catalogue 8316. The album consists of unreleased takes from two sessions that resulted in two prior albums. "Blue Calypso" and "Falling In Love With Love" are from the April 19, 1957 session that resulted in half of 1957 Waldron's "Mal/2" album; these tracks can currently be found as additional tracks on the CD reissue of that album. "Dealin'" and "Wheelin" are from a September 20, 1957 session, and are alternate takes of tracks originally released on the 1958 "Wheelin' & Dealin'" album (Prestige PRLP 7131); these tracks can currently be found as additional tracks on the CD reissue of that album. All tracks are also available as part of the 2009 John Coltrane's box set "Side Steps".
Document: Malcolm Earl "Mal" Waldron (August 16, 1925 – December 2, 2002) was an American jazz pianist, composer, and arranger. Mal Waldron was born in New York City on August 16, 1925, to West Indian immigrants. His father was a mechanical engineer who worked on the Long Island Rail Road. The family moved to Jamaica, Queens when Mal was four years old. Waldron's parents discouraged his initial interest in jazz, but he was able to maintain it by listening to swing on the radio.
Document: Effects of Hurricane Sandy in New York: Hurricane Sandy Category 1 hurricane (SSHWS / NWS) Satellite image of Sandy at 4: 15 p.m. EDT on October 29 as it was about to make landfall on the Jersey Shore Formed October 28, 2012 (First rainbands begin to affect New Jersey) Dissipated November 2, 2012 (Dissipated as extratropical cyclone) (Extratropical after October 29) Highest winds 1 - minute sustained: 80 mph (130 km / h) Highest gust Gusts: 100 mph (155 km / h) Lowest pressure 945 mbar (hPa); 27.91 inHg Fatalities 53 total Damage $32 billion (2012 USD) (Estimated damage total) Areas affected New York, especially the New York metropolitan area Part of the 2012 Atlantic hurricane season Part of a series on Hurricane Sandy General Meteorological history Impact Greater Antilles United States Maryland and Washington, D.C. New Jersey New York New England Canada Other wikis Commons: Sandy images Wikinews: Sandy stories
## Output
October 28, 2012
"""

# The same file, l.385 (FINAL_ANSWER_GENERATION_USER_PROMPT), verbatim.
FINAL_ANSWER_USER_PROMPT = (
    "Now, please provide the final answer to the main question. Respond with an appro"
    "priate answer only, do not explain yourself or output anything else."
)


def state_documents(rounds: Sequence[Round], per_round: int | None = 1) -> list[str]:
    """``title: text`` of the documents a state holds, each once (the reference's ``history``,
    ``Training/preprocessing/extract_partial_traces.py`` l.50)."""
    seen, out = set(), []
    for chosen in selected_documents(rounds, per_round):
        for doc_id, title, text in chosen:
            if doc_id not in seen:
                seen.add(doc_id)
                out.append(f"{title}: {' '.join(text.split())}")
    return out


def answer_messages(question: str, documents: Sequence[str]) -> list[dict[str, str]]:
    """The reference's ``gen_final_answer_docs_only_prompt`` (prompts.py l.417-429) over
    ``Document: ...`` lines (``compute_metrics.py`` l.72-74)."""
    trace = "\n".join(f"Document: {doc}" for doc in documents)
    user = "Main question: " + question.strip() + "\n\n" + trace.strip() + "\n\n" + FINAL_ANSWER_USER_PROMPT
    return [{"role": "system", "content": FINAL_ANSWER_DOCS_PROMPT}, {"role": "user", "content": user}]


StateKey = tuple[str, int]  # (qid, iteration)


@dataclass(frozen=True)
class StateScores:
    """One question's states scored by one answer generator, iteration -> value: ``f1``, the answers' mean
    F1 (the reward), and ``em``, the same answers' mean exact match."""

    f1: dict[int, float]
    em: dict[int, float]


def probe_scores(rows: Sequence[dict[str, Any]], golden: Sequence[str], rule: Rule) -> StateScores:
    """The recorded probes' scores: their F1 (:func:`~raypipe.stoprag.targets.probe_rewards`) and their
    exact match under ``rule``, the rule their F1 was scored by (a probe that produced nothing scores 0)."""
    exact = {r["iteration"]: exact_match(r.get("probe_answer"), golden, rule) for r in rows}
    return StateScores(probe_rewards(rows), exact)


async def generator_rewards(
    engine: Engine,
    states: dict[StateKey, tuple[str, list[str]]],
    golden: dict[str, list[str]],
    cfg: StopRagConfig,
    rule: Rule,
    seed: int = 0,
    concurrency: int = 64,
) -> tuple[dict[str, StateScores], list[dict]]:
    """Mean F1 and mean exact match of ``cfg.reward_samples`` generated answers for every state (question,
    documents), by qid, and one row per answer (qid, iteration, sample, answer, f1, em). A failed generation
    scores 0, as a probe that produced nothing does."""
    gate = asyncio.Semaphore(concurrency)

    async def one(key: StateKey, sample: int) -> tuple[StateKey, int, str | None]:
        question, documents = states[key]
        prompt = engine.apply_chat_template(answer_messages(question, documents))
        request = GenerationRequest(
            prompt=prompt,
            max_tokens=cfg.reward_max_tokens,
            temperature=cfg.reward_temperature,
            seed=None if cfg.reward_temperature == 0 else seed + sample,
        )
        async with gate:
            try:
                return key, sample, (await engine.generate(request)).text.strip()
            except EngineError:
                return key, sample, None

    results = await asyncio.gather(*(one(k, s) for k in states for s in range(cfg.reward_samples)))
    rows, scores = [], {qid: StateScores({}, {}) for qid, _ in states}
    for (qid, it), sample, answer in results:
        f1, em = f1_score(answer, golden[qid], rule), exact_match(answer, golden[qid], rule)  # None scores 0
        for total, value in ((scores[qid].f1, f1), (scores[qid].em, em)):
            total[it] = total.get(it, 0.0) + value / cfg.reward_samples
        rows.append({"qid": qid, "iteration": it, "sample": sample, "answer": answer, "f1": f1, "em": em})
    return scores, rows


def rescore(trajectory: Trajectory, scores: StateScores) -> Trajectory:
    """The trajectory with every iteration's answer, the natural ending's included, scored by ``scores``:
    F1 and exact match of the same answers."""
    states = range(trajectory.n_iterations + 1)
    missing = [i for i in states if i not in scores.f1 or i not in scores.em]
    if missing:
        raise ValueError(f"question {trajectory.qid}: no reward for iterations {missing}")
    f1, em = tuple(scores.f1[i] for i in states), tuple(scores.em[i] for i in states)
    return replace(trajectory, probe_f1=f1, final_f1=f1[-1], probe_em=em, final_em=em[-1])


def generator_note(cfg: StopRagConfig, model: str) -> str:
    """Names the answer generator in the comparison table."""
    if cfg.reward_source == "probe":
        return f"answers: the agent's probed answer at each state, the terminal one included ({model}, greedy)"
    return (
        f"answers: the reference's docs-only final-answer prompt ({model}), mean F1 of {cfg.reward_samples} "
        f"at T={cfg.reward_temperature:g}, every state, the terminal one included"
    )
