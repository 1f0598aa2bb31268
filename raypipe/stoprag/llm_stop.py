"""LLM-Stop: the engine itself is asked whether to stop, the prompting baseline of Stop-RAG.

The prompt is the public one, quoted exactly: :data:`SYSTEM_PROMPT` is ``STOP_DECISION_SYSTEM_PROMPT``
and :data:`USER_INSTRUCTION` is ``STOP_DECISION_USER_PROMPT`` of chosolbee/MHQA-SetVerify
``pipeline/stop_decider/prompts.py`` (commit e2da463, l.87-312 and l.315; its seven worked examples:
three questions, each followed round by round up to its ``<STOP>``), and the user message is built as
its ``gen_stop_decision_prompt`` (l.318-330) builds it: ``Main question: {question}``, a blank line, the
trace, a blank line, the instruction. The trace is the reference pipeline's (``pipeline/pipeline_sep.py``
l.83-94): per round ``Follow up: {query}``, ``Document: {title}: {text}`` for the round's selected
document (:func:`raypipe.stoprag.targets.selected_documents`, one per round, full text) and
``Intermediate answer: {answer}``; our rounds are the agent's retrieval iterations, and the intermediate
answer is that iteration's probed answer.

Parsing (:func:`parse_decision`) decides as the reference's ``StopDecider.extract_decision``
(``pipeline/stop_decider/stop_decider.py`` l.49-77): the first line starting with ``Decision:`` (any case,
no leading space) whose rest contains ``STOP`` (checked first) or ``CONTINUE`` (substrings, any case)
decides; otherwise the whole output decides: ``STOP`` without ``CONTINUE`` is stop, any ``CONTINUE`` is
continue, neither is the default (continue, as the reference). :func:`parse_decision_tolerant`, the
named option ``stoprag.llm_stop_parser=tolerant``, also reads markdown decision lines
(``**Decision:** <STOP>``), counts only ``<STOP>``/``<CONTINUE>`` tokens outside them and applies the
default when both kinds appear.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.core.rows import OnlineRow
from raypipe.llm.base import Engine, EngineError, GenerationRequest
from raypipe.stoprag.targets import Round, rounds_from_history, selected_documents

# chosolbee/MHQA-SetVerify pipeline/stop_decider/prompts.py l.87-312 (STOP_DECISION_SYSTEM_PROMPT), verbatim.
SYSTEM_PROMPT = """
Given an original question and a series of follow-up questions each paired with its top Wikipedia snippet plus intermediate answers, analyze step by step whether there is sufficient information to provide a complete and accurate final answer to the original question.

Process:
- You receive:
    - Main question: <original question>
    - One or more rounds of:
      - Follow up: <follow-up question>  
      - Document: <top Wikipedia snippet>  
      - Intermediate answer: <answer to the follow-up question based on the Document>

- Your task:
    1. Think step by step about what information is needed to answer the original question
    2. Analyze what information has been gathered so far
    3. Determine if any critical information is still missing
    4. Make a reasoned decision about whether to stop or continue

Format your response as:
Analysis: [Step-by-step reasoning about information completeness]
Decision: <STOP> or <CONTINUE>

Decision criteria:
- <STOP>: All components of the original question can be answered with current information such that a complete and final answer can be derived from it.
- <CONTINUE>: Missing any required information needed to answer the original question.

Output only the analysis and decision after the given prompt. Do not repeat the given prompt in your response.

Example:

#
## Input
Main Question: What is the major railroad museum located in the location where Andre Bloc lived at his time of death?

Follow up: Where did André Bloc live when he died?
Document: André Bloc (Algiers, May 23, 1896 – New Delhi, November 8, 1966) was a French sculptor, magazine editor, and founder of several specialist journals. He founded the "Groupe Espace" in 1949.
Intermediate answer: André Bloc died in New Delhi.
## Output
Analysis: To answer the original question, I need two pieces of information: (1) Where André Bloc lived when he died, and (2) What is the major railroad museum in that location. I have found that André Bloc died in New Delhi, which answers the first part. However, I still need to find information about the major railroad museum located in New Delhi.
Decision: <CONTINUE>

#
## Input
Main Question: What is the major railroad museum located in the location where Andre Bloc lived at his time of death?

Follow up: Where did André Bloc live when he died?
Document: André Bloc (Algiers, May 23, 1896 – New Delhi, November 8, 1966) was a French sculptor, magazine editor, and founder of several specialist journals. He founded the "Groupe Espace" in 1949.
Intermediate answer: André Bloc died in New Delhi.
Follow up: What is the name of the major railroad related museum located in New Delhi?
Document: New Delhi is home to Indira Gandhi Memorial Museum, National Gallery of Modern Art, National Museum of Natural History, National Rail Museum, National Handicrafts and Handlooms Museum, National Philatelic Museum, Nehru Planetarium, Shankar's International Dolls Museum. and Supreme Court of India Museum.
Intermediate answer: The National Rail Museum is located in New Delhi.
## Output
Analysis: To answer the original question, I needed: (1) Where André Bloc lived when he died - I found this is New Delhi, and (2) What is the major railroad museum in that location - I found this is the National Rail Museum. I now have all the information needed to provide a complete answer to the original question.
Decision: <STOP>

#
## Input
Main Question: What is the least popular official language in the country where a spiral viaduct is located in Karin Thomas' birthplace?

Follow up: Where was Karin Thomas born?
Document: Karin Thomas (born 3 October 1961 in Brusio) was a Swiss cross country skier who competed from 1982 to 1988. She finished sixth in the 4 x 5 km relay at the 1984 Winter Olympics in Sarajevo and fourth in that same event at the 1988 Winter Olympics in Calgary.
Intermediate answer: Karin Thomas was born in Brusio.
Follow up: In which country is a spiral viaduct is located in Brusio?
Document: Brusio spiral viaduct: A signature structure of the World Heritage-listed Bernina railway, it is located near Brusio, in the Canton of Graubünden, Switzerland, and was built to limit the railway's gradient at that location within its specified maximum of 7%.
Intermediate answer: The Brusio spiral viaduct is located in Switzerland.
## Output
Analysis: To answer the original question, I need: (1) Karin Thomas' birthplace - found to be Brusio, (2) The country where a spiral viaduct is located in Brusio - found to be Switzerland, and (3) The least popular official language in Switzerland. I have the first two pieces of information but still need to find out what the least popular official language of Switzerland is.
Decision: <CONTINUE>

#
## Input
Main Question: What is the least popular official language in the country where a spiral viaduct is located in Karin Thomas' birthplace?

Follow up: Where was Karin Thomas born?
Document: Karin Thomas (born 3 October 1961 in Brusio) was a Swiss cross country skier who competed from 1982 to 1988. She finished sixth in the 4 x 5 km relay at the 1984 Winter Olympics in Sarajevo and fourth in that same event at the 1988 Winter Olympics in Calgary.
Intermediate answer: Karin Thomas was born in Brusio.
Follow up: In which country is a spiral viaduct is located in Brusio?
Document: Brusio spiral viaduct: A signature structure of the World Heritage-listed Bernina railway, it is located near Brusio, in the Canton of Graubünden, Switzerland, and was built to limit the railway's gradient at that location within its specified maximum of 7%.
Intermediate answer: The Brusio spiral viaduct is located in Switzerland.
Follow up: What is the least popular official language of Switzerland?
Document: Switzerland has four official languages: principally German (63.5% total population share, with foreign residents, in 2013); French (22.5%) in the west; and Italian (8.1%) in the south. The fourth official language, Romansh (0.5%), is a Romance language spoken locally in the southeastern trilingual canton of Graubünden, and is designated by Article 4 of the Federal Constitution as a national language along with German, French, and Italian, and in Article 70 as an official language if the authorities communicate with persons who speak Romansh. However, federal laws and other official acts do not need to be decreed in Romansh.
Intermediate answer: The least popular official language is Romansh.
## Output
Analysis: To answer the original question, I needed: (1) Karin Thomas' birthplace - Brusio, (2) The country where a spiral viaduct is located in Brusio - Switzerland, and (3) The least popular official language in Switzerland - Romansh (0.5% of population). I now have all three pieces of information needed to provide a complete answer.
Decision: <STOP>

#
## Input
Main Question: When did hurricane Sandy hit the city where The Dealers' performer was born?

Follow up: Who is the performer of The Dealers?
Document: The Dealers is a 1964 album by jazz musician Mal Waldron released on Status Records, catalogue 8316. The album consists of unreleased takes from two sessions that resulted in two prior albums. "Blue Calypso" and "Falling In Love With Love" are from the April 19, 1957 session that resulted in half of 1957 Waldron's "Mal/2" album; these tracks can currently be found as additional tracks on the CD reissue of that album. "Dealin'" and "Wheelin" are from a September 20, 1957 session, and are alternate takes of tracks originally released on the 1958 "Wheelin' & Dealin'" album (Prestige PRLP 7131); these tracks can currently be found as additional tracks on the CD reissue of that album. All tracks are also available as part of the 2009 John Coltrane's box set "Side Steps".
Intermediate answer: The Dealers is an album by Mal Waldron.
## Output
Analysis: To answer the original question, I need: (1) Who is the performer of The Dealers - I found this is Mal Waldron, (2) Where was Mal Waldron born, and (3) When did hurricane Sandy hit that city. I have the first piece of information but still need to find Mal Waldron's birthplace and then when hurricane Sandy hit that city.
Decision: <CONTINUE>

#
## Input
Main Question: When did hurricane Sandy hit the city where The Dealers' performer was born?

Follow up: Who is the performer of The Dealers?
Document: The Dealers is a 1964 album by jazz musician Mal Waldron released on Status Records, catalogue 8316. The album consists of unreleased takes from two sessions that resulted in two prior albums. "Blue Calypso" and "Falling In Love With Love" are from the April 19, 1957 session that resulted in half of 1957 Waldron's "Mal/2" album; these tracks can currently be found as additional tracks on the CD reissue of that album. "Dealin'" and "Wheelin" are from a September 20, 1957 session, and are alternate takes of tracks originally released on the 1958 "Wheelin' & Dealin'" album (Prestige PRLP 7131); these tracks can currently be found as additional tracks on the CD reissue of that album. All tracks are also available as part of the 2009 John Coltrane's box set "Side Steps".
Intermediate answer: The Dealers is an album by Mal Waldron.
Follow up: Where was Mal Waldron born?
Document: Malcolm Earl "Mal" Waldron (August 16, 1925 – December 2, 2002) was an American jazz pianist, composer, and arranger. Mal Waldron was born in New York City on August 16, 1925, to West Indian immigrants. His father was a mechanical engineer who worked on the Long Island Rail Road. The family moved to Jamaica, Queens when Mal was four years old. Waldron's parents discouraged his initial interest in jazz, but he was able to maintain it by listening to swing on the radio.
Intermediate answer: Mal Waldron was born in New York City.
## Output
Analysis: To answer the original question, I need: (1) Who is the performer of The Dealers - Mal Waldron, (2) Where was Mal Waldron born - New York City, and (3) When did hurricane Sandy hit New York City. I have the first two pieces of information but still need to find when hurricane Sandy hit New York City.
Decision: <CONTINUE>

#
## Input
Main Question: When did hurricane Sandy hit the city where The Dealers' performer was born?

Follow up: Who is the performer of The Dealers?
Document: The Dealers is a 1964 album by jazz musician Mal Waldron released on Status Records, catalogue 8316. The album consists of unreleased takes from two sessions that resulted in two prior albums. "Blue Calypso" and "Falling In Love With Love" are from the April 19, 1957 session that resulted in half of 1957 Waldron's "Mal/2" album; these tracks can currently be found as additional tracks on the CD reissue of that album. "Dealin'" and "Wheelin" are from a September 20, 1957 session, and are alternate takes of tracks originally released on the 1958 "Wheelin' & Dealin'" album (Prestige PRLP 7131); these tracks can currently be found as additional tracks on the CD reissue of that album. All tracks are also available as part of the 2009 John Coltrane's box set "Side Steps".
Intermediate answer: The Dealers is an album by Mal Waldron.
Follow up: Where was Mal Waldron born?
Document: Malcolm Earl "Mal" Waldron (August 16, 1925 – December 2, 2002) was an American jazz pianist, composer, and arranger. Mal Waldron was born in New York City on August 16, 1925, to West Indian immigrants. His father was a mechanical engineer who worked on the Long Island Rail Road. The family moved to Jamaica, Queens when Mal was four years old. Waldron's parents discouraged his initial interest in jazz, but he was able to maintain it by listening to swing on the radio.
Intermediate answer: Mal Waldron was born in New York City.
Follow up: When did hurricane sandy hit New York City?
Document: Effects of Hurricane Sandy in New York: Hurricane Sandy Category 1 hurricane (SSHWS / NWS) Satellite image of Sandy at 4: 15 p.m. EDT on October 29 as it was about to make landfall on the Jersey Shore Formed October 28, 2012 (First rainbands begin to affect New Jersey) Dissipated November 2, 2012 (Dissipated as extratropical cyclone) (Extratropical after October 29) Highest winds 1 - minute sustained: 80 mph (130 km / h) Highest gust Gusts: 100 mph (155 km / h) Lowest pressure 945 mbar (hPa); 27.91 inHg Fatalities 53 total Damage $32 billion (2012 USD) (Estimated damage total) Areas affected New York, especially the New York metropolitan area Part of the 2012 Atlantic hurricane season Part of a series on Hurricane Sandy General Meteorological history Impact Greater Antilles United States Maryland and Washington, D.C. New Jersey New York New England Canada Other wikis Commons: Sandy images Wikinews: Sandy stories
Intermediate answer: Hurricane sandy hit New York City in October 28, 2012.
## Output
Analysis: To answer the original question, I needed: (1) Who is the performer of The Dealers - Mal Waldron, (2) Where was Mal Waldron born - New York City, and (3) When did hurricane Sandy hit New York City - October 28, 2012. I now have all three pieces of information needed to provide a complete answer.
Decision: <STOP>
"""

# The same file, l.315 (STOP_DECISION_USER_PROMPT), verbatim (it has no final full stop).
USER_INSTRUCTION = "Based on the information provided, give a short analysis of whether the original question can be answered. Then, decide whether to stop or continue gathering information"

Verdict = Literal["stop", "continue"]
# The named option ``enforce``: the output format as a bounded regex (vLLM structured outputs).
DECISION_REGEX = r"Analysis: [^\n<>]{1,400}\nDecision: <(STOP|CONTINUE)>"


def format_rounds(rounds: Sequence[Round], docs: int = 1, doc_chars: int | None = None) -> str:
    """The rounds as the reference's trace shows them: each round's ``docs`` selected documents
    (:func:`selected_documents`), cut to ``doc_chars`` characters when set (the reference keeps them whole)."""
    lines: list[str] = []
    for rnd, chosen in zip(rounds, selected_documents(rounds, docs)):
        lines.append(f"Follow up: {(rnd.query or '').strip()}")
        for _, title, text in chosen:
            body = " ".join(text.split())
            lines.append(f"Document: {title}: {body if doc_chars is None else body[:doc_chars]}")
        lines.append(f"Intermediate answer: {(rnd.answer or '').strip()}")
    return "\n".join(lines)


def build_messages(
    question: str, rounds: Sequence[Round], docs: int = 1, doc_chars: int | None = None
) -> list[dict[str, str]]:
    """System and user messages as ``gen_stop_decision_prompt`` (prompts.py l.318-330) builds them."""
    trace = format_rounds(rounds, docs, doc_chars).strip()
    user = "Main question: " + question.strip() + "\n\n" + trace + "\n\n" + USER_INSTRUCTION
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


Source = Literal["decision_line", "text", "token", "default_both", "default_neither"]
ParserName = Literal["reference", "tolerant"]


@dataclass(frozen=True)
class Parsed:
    verdict: Verdict
    source: Source  # which rule decided


def parse_decision(text: str, default: Verdict = "continue") -> Parsed:
    """The reference parser (``stop_decider.py`` l.49-77; rules in the module docstring)."""
    stripped = text.strip()
    for line in stripped.splitlines():
        if line.upper().startswith("DECISION:"):
            rest = line[len("DECISION:") :].upper()
            if "STOP" in rest:  # "Decision: <STOP> or <CONTINUE>" is a stop, as there
                return Parsed("stop", "decision_line")
            if "CONTINUE" in rest:
                return Parsed("continue", "decision_line")
    upper = stripped.upper()
    if "STOP" in upper and "CONTINUE" not in upper:
        return Parsed("stop", "text")
    if "CONTINUE" in upper:  # both named outside a decision line: continue, as there
        return Parsed("continue", "text")
    return Parsed(default, "default_neither")


_TOKEN = re.compile(r"<\s*(stop|continue)\s*>", re.IGNORECASE)
_WORD = re.compile(r"\b(stop|continue)\b", re.IGNORECASE)
_DECISION_LINE = re.compile(r"^[\s>*_#-]*decision[\s*_]*:(.*)$", re.IGNORECASE | re.MULTILINE)


def parse_decision_tolerant(text: str, default: Verdict = "continue") -> Parsed:
    """The named option ``tolerant``: the first decision line (markdown allowed) naming exactly one of
    stop/continue as a word decides; else ``<STOP>``/``<CONTINUE>`` tokens when only one kind appears;
    else ``default`` (bare words outside a decision line are ignored)."""
    for line in _DECISION_LINE.findall(text):
        kinds = {m.lower() for m in _WORD.findall(line)}
        if len(kinds) == 1:
            return Parsed(kinds.pop(), "decision_line")  # type: ignore[arg-type]
    kinds = {m.lower() for m in _TOKEN.findall(text)}
    if len(kinds) == 1:
        return Parsed(kinds.pop(), "token")  # type: ignore[arg-type]
    return Parsed(default, "default_both" if kinds else "default_neither")


PARSERS = {"reference": parse_decision, "tolerant": parse_decision_tolerant}


class LLMStopController:
    """LLM-Stop as an online controller (:class:`raypipe.agents.hooks.StopController`) over an Engine.

    Iterations before ``first_decision`` always continue (0: the probe before any retrieval). An engine
    error on the decision prompt is the default verdict, not a failed trajectory. ``enforce`` constrains
    the output to :data:`DECISION_REGEX` (needs an engine with structured outputs).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_tokens: int = 200,
        temperature: float = 0.0,
        docs: int = 1,
        doc_chars: int | None = None,
        default: Verdict = "continue",
        first_decision: int = 1,
        seed: int | None = None,
        enforce: bool = False,
        parser: ParserName = "reference",
    ):
        if parser not in PARSERS:
            raise ValueError(f"unknown LLM-Stop parser {parser!r}; one of {', '.join(PARSERS)}")
        self.engine = engine
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.regex = DECISION_REGEX if enforce else None
        self.docs, self.doc_chars, self.default, self.first_decision = docs, doc_chars, default, first_decision
        self.parse = PARSERS[parser]

    async def judge(self, question: str, rounds: Sequence[Round]) -> tuple[Parsed, str]:
        """The parsed verdict and the raw output for a state given by its rounds."""
        prompt = self.engine.apply_chat_template(build_messages(question, rounds, self.docs, self.doc_chars))
        request = GenerationRequest(
            prompt=prompt, max_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed, regex=self.regex
        )
        try:
            gen = await self.engine.generate(request)
        except EngineError as exc:
            return Parsed(self.default, "default_neither"), f"<engine error: {exc}>"
        return self.parse(gen.text, self.default), gen.text

    async def decide(self, question: str, history: list[OnlineRow]) -> StopDecision:
        rounds = rounds_from_history(history)
        if len(rounds) < max(self.first_decision, 1):
            return CONTINUE
        parsed, _ = await self.judge(question, rounds)
        if parsed.verdict == "stop":
            return StopDecision(stop=True, reason=f"llm_stop:{parsed.source}")
        return CONTINUE


async def judge_prefixes(
    controller: LLMStopController, items: Sequence[tuple[str, int, str, Sequence[Round]]], concurrency: int = 64
) -> dict[str, dict[int, tuple[Parsed, str]]]:
    """Offline: judge many states at once (the engine batches them). ``items`` = (qid, iteration,
    question, rounds up to that iteration); returns qid -> iteration -> (verdict, raw output)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(question: str, rounds: Sequence[Round]):
        async with gate:
            return await controller.judge(question, rounds)

    results = await asyncio.gather(*(one(q, r) for _, _, q, r in items))
    out: dict[str, dict[int, tuple[Parsed, str]]] = {}
    for (qid, it, _, _), res in zip(items, results):
        out.setdefault(qid, {})[it] = res
    return out
