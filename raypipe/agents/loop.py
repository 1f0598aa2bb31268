"""The agent loop with in-trajectory probing: one question in, one trajectory row and its iteration rows out.

Turn t generates from the context; then (probing on) the probe forces an answer from the same context
plus the turn's reasoning (greedy, stop at the closing answer tag, token log-probs kept); then an
online controller, if given, may stop the trajectory; then the turn's action runs: an answer ends the
trajectory, a search retrieves ``deep_k`` documents (the agent reads ``top_k``) and the next turn reads
them. Rows are numbered by turn: row 0 is the probe after r_0 before any retrieval, row i (i >= 1)
holds the query of turn i-1, its documents, the reasoning r_i and probe i, with P_i = F1 of probe i
and U_i = P_i - P_{i-1}.

The protocol's :meth:`~raypipe.agents.protocol.AgentProtocol.turn_plan` says how many turns run and
how many of them may search (Search-R1's original loop ends with a final rollout whose search is not
run). When the turn budget ends after a search, by default nothing reads its documents: no row, no
generation, no final answer (F1 0), as pyterrier-rag (``frameworks/agentic/_base.py``, "No answer after
max turns") and the seed paper (``probing/agents.py``) do; ``agent.at_limit="forced"`` adds one forced
answer (the protocol's probe prompt with no reasoning, greedy) that reads them: its row's probe and the
final answer. In the pyterrier format a search that returns no documents ends the trajectory there
(``no_results``, pyterrier-rag's "No retrieval results"), before the model is called again.

A turn's search does not depend on its probe, so the two run together; the search's documents enter
the context only after the controller (if any) has let the trajectory go on: a search the controller
makes moot is dropped (``search_dropped``), its cost still counted. Nor does the next turn depend on the
probe unless a controller reads it: with ``agent.probe_overlap`` (the default) and no controller, a
probe runs beside the trajectory's following turns instead of before them, off its critical path. Its
row is completed (and told to the observer) when the probe ends, in order; a probe that fails ends the
trajectory where it would have ended had the probe run first (the later turns are undone). Under a
:class:`TurnBarrier` the loop follows instead the peers' turn-synchronous schedule (pyterrier-rag's
agents, Search-R1's ``generation.py``): every live trajectory generates its turn, then all search, then
all probe. Outputs are the same in every schedule: only the order of independent requests changes
(:mod:`raypipe.agents.schedule`).

Each row records the cost of its turn (``raypipe.core.schema.ITERATION_COSTS``): prompt tokens of its
requests and those served from the prefix cache, the time of the search the turn issued, and the
engine's queue and engine seconds where the backend reports them, and the controller's decision on it
(``decision_s``, null without a controller); the trajectory row holds their sums (decision time aside).

A failure on one question ends that trajectory with its ``stop_reason`` and message; the rows produced so
far are kept. Outages, which a rerun retries: ``engine_error`` (the engine could not answer,
:class:`~raypipe.llm.base.EngineUnavailableError`) and ``retrieval_error`` (a search failed). The question's
own failures, which a rerun keeps: ``context_overflow``, ``no_valid_action``, ``query_crash`` (its query
crashed the retrieval replica even when searched alone, :class:`~raypipe.retrieval.types.QueryCrashError`)
and ``internal_error``: a request the engine refused (any other :class:`~raypipe.llm.base.EngineError`), a
prompt that cannot be built, and any other exception (a bug in the loop, its protocol or its controller).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar, cast

from raypipe.agents.barrier import TurnBarrier
from raypipe.agents.hooks import StopController
from raypipe.agents.protocol import ANSWER, INVALID, AgentProtocol
from raypipe.agents.schedule import Concurrent, Schedule
from raypipe.core.config import AgentConfig
from raypipe.core.metrics import f1_score
from raypipe.core.rows import IterationCosts, IterationRow, OnlineRow, TrajectoryCosts, TrajectoryRow
from raypipe.core.schema import (
    STOP_ANSWER,
    STOP_CONTEXT,
    STOP_CONTROLLER,
    STOP_ENGINE_ERROR,
    STOP_INTERNAL_ERROR,
    STOP_MAX_TURNS,
    STOP_NO_ACTION,
    STOP_NO_RESULTS,
    STOP_QUERY_CRASH,
    STOP_RETRIEVAL_ERROR,
)
from raypipe.data.loaders import Question
from raypipe.llm.base import (
    ContextOverflowError,
    Engine,
    EngineDiedError,
    EngineError,
    EngineUnavailableError,
    Generation,
    GenerationRequest,
)
from raypipe.retrieval.types import QueryCrashError, Retriever, SearchResult

# Told of each iteration row as it is added (the row without its private fields; costs not yet final).
IterationObserver = Callable[[IterationRow], None]


@dataclass
class TrajectoryOutput:
    trajectory: TrajectoryRow
    iterations: list[IterationRow]


class _Row(IterationRow):
    """An iteration row as the loop holds it: with the titles and texts of the documents the agent read
    (an online controller sees them; the written row does not hold them)."""

    _titles: list[str]
    _texts: list[str]


def _public(row: _Row) -> IterationRow:
    return cast(IterationRow, {k: v for k, v in row.items() if not k.startswith("_")})


def _online(row: _Row) -> OnlineRow:
    """What an online controller sees of ``row``."""
    return OnlineRow(
        qid=row["qid"],
        dataset=row["dataset"],
        iteration=row["iteration"],
        query=row["query"],
        doc_ids=row["doc_ids"],
        doc_scores=row["doc_scores"],
        reasoning=row["reasoning"],
        probe_answer=row["probe_answer"],
        probe_token_logprobs=row["probe_token_logprobs"],
        tokens_generated=row["tokens_generated"],
        probe_tokens=row["probe_tokens"],
        doc_titles=row["_titles"],
        doc_texts=row["_texts"],
    )


class _Stop(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class _Retrieval:
    query: str
    result: SearchResult
    visible: int


@dataclass
class _State:
    """What a trajectory returns to when a probe run beside its later turns fails."""

    context: str
    rows: int
    retrievals: int


@dataclass
class _Searched:
    """A finished search: its result or its failure, and how long the agent waited for it."""

    query: str
    result: SearchResult | None
    error: Exception | None
    seconds: float


class AgentLoop:
    """Runs trajectories of one protocol against one engine and one retriever (many may run concurrently).

    ``agent`` is the run's agent section; besides it the loop needs the retrieval depths (a search
    retrieves ``deep_k`` documents, the agent reads ``top_k``) and the run's seed (sampled turns).
    The loop's schedule is :class:`~raypipe.agents.schedule.Concurrent`; a ``barrier`` replaces it with the
    peers' lock-step one, and then every trajectory of the barrier's parties must be run at once (one ``run``
    each).
    """

    def __init__(
        self,
        engine: Engine,
        retriever: Retriever,
        protocol: AgentProtocol,
        agent: AgentConfig,
        *,
        top_k: int,
        deep_k: int,
        seed: int = 0,
        controller: StopController | None = None,
        barrier: TurnBarrier | None = None,
    ):
        self.engine = engine
        self.retriever = retriever
        self.protocol = protocol
        self.agent = agent
        self.top_k, self.deep_k, self.seed = top_k, deep_k, seed
        self.controller = controller
        self.schedule: Schedule = barrier if barrier is not None else Concurrent()
        # a turn's probe runs beside the trajectory's next turns unless the controller reads it first
        self.probes_beside = (
            agent.probe and agent.probe_overlap and controller is None and self.schedule.probes_may_overlap
        )

    async def run(self, question: Question, observer: IterationObserver | None = None) -> TrajectoryOutput:
        """One trajectory; ``observer`` (optional) is told of each iteration row as it is added (a service
        streams them), before the controller decides on it."""
        started = time.monotonic()
        run = _Run(self, question, observer)
        try:
            await run.steps()
        except _Stop as stop:
            run.stop_reason, run.error = stop.reason, str(stop)
        except EngineDiedError:  # not this row's failure: the caller reruns the trajectory on a new engine
            raise
        except Exception as exc:  # noqa: BLE001 - one bad row never kills the job: record it (an outage too)
            run.stop_reason = STOP_ENGINE_ERROR if isinstance(exc, EngineUnavailableError) else STOP_INTERNAL_ERROR
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.schedule.leave()
        return run.output(time.monotonic() - started)


class _Run:
    """The state of one trajectory."""

    def __init__(self, loop: AgentLoop, question: Question, observer: IterationObserver | None = None):
        self.loop, self.question, self.observer = loop, question, observer
        self.protocol, self.agent = loop.protocol, loop.agent
        self.rows: list[_Row] = []
        self.prompt = ""
        self.context = ""
        self.tail = ""  # text after the context that belongs to the transcript (the forced answer)
        self.final_answer: str | None = None
        self.stop_reason = STOP_MAX_TURNS
        self.error: str | None = None
        self.retrievals = 0
        # probes running beside the later turns, oldest first, each with the state to return to if it fails
        self.pending_probes: list[tuple[asyncio.Future, _State]] = []

    async def steps(self) -> None:
        try:
            await self._turns()
        except _Stop:
            await self._join_probes()  # a failed earlier probe ended the trajectory first
            raise
        except BaseException:
            await self._cancel_probes(self.pending_probes)
            raise
        await self._join_probes()

    async def _turns(self) -> None:
        agent, protocol = self.agent, self.protocol
        try:
            self.prompt = protocol.prompt(self.question.question, self.loop.engine.apply_chat_template)
        except Exception as exc:
            raise _Stop(STOP_INTERNAL_ERROR, f"prompt: {type(exc).__name__}: {exc}") from exc
        self.context = self.prompt
        pending: _Retrieval | None = None
        generations, searching = protocol.turn_plan(agent)
        for turn in range(generations):
            regex = protocol.enforcement_regex(agent, turn)
            gen = await self._generate(
                self.context, agent.max_new_tokens, agent.temperature, protocol.stop, regex, turn
            )
            await self.loop.schedule.turn_generated()
            output = protocol.restore_stop(protocol.clean_output(gen.text), gen.stop_string)  # as the context holds it
            row = self._row(turn, pending, output, len(gen.token_ids))
            _charge(row, gen)
            action = protocol.parse_action(protocol.restore_stop(gen.text, gen.stop_string))  # before any cleaning
            query = action.content if action.kind not in (ANSWER, INVALID) and turn < searching else None
            searched = await self._search_and_probe(row, query, output)
            self.context += protocol.joiner + output + protocol.close_action(output, action)
            if await self._controller_stops():
                row["search_dropped"] = searched is not None
                return
            if action.kind == ANSWER:
                self.final_answer, self.stop_reason = action.content, STOP_ANSWER
                return
            if action.kind == INVALID:
                correction = protocol.correction()
                if correction is None:
                    raise _Stop(STOP_NO_ACTION, f"turn {turn}: neither a search nor an answer")
                self.context += correction
                pending = None
                continue
            if searched is None:  # a final rollout: its search is not run
                return
            pending = self._read(searched)
        if pending is not None and agent.at_limit == "forced":
            await self._forced_answer(pending)

    def _append_row(self, row: _Row) -> None:
        self.rows.append(row)
        self._tell(row)

    def _tell(self, row: _Row) -> None:
        if self.observer is not None:
            self.observer(_public(row))

    def _probe_beside(self, row: _Row, prompt: str) -> None:
        """Start the turn's probe and go on; the row joins the trajectory now, its probe columns later."""
        previous = self.pending_probes[-1][0] if self.pending_probes else None
        before = _State(self.context, len(self.rows), self.retrievals)
        self.rows.append(row)
        self.pending_probes.append((asyncio.ensure_future(self._finish_probe(row, prompt, previous)), before))

    async def _finish_probe(self, row: _Row, prompt: str, previous: asyncio.Future | None) -> None:
        gen = await self._probe_generate(prompt)
        if previous is not None:  # rows are completed and told in order (a utility needs the row before)
            await previous
        self._record_probe(row, gen)
        self._tell(row)

    async def _join_probes(self) -> None:
        """Wait for the probes still running; the first that failed puts the trajectory back to where it was
        when that probe started, and its failure ends the trajectory."""
        pending, self.pending_probes = self.pending_probes, []
        for index, (task, before) in enumerate(pending):
            try:
                await task
            except BaseException:
                await self._cancel_probes(pending[index + 1 :])
                self.context, self.retrievals = before.context, before.retrievals
                del self.rows[before.rows :]
                self.final_answer, self.tail = None, ""
                raise

    @staticmethod
    async def _cancel_probes(pending: list[tuple[asyncio.Future, _State]]) -> None:
        for task, _ in pending:
            task.cancel()
        await asyncio.gather(*(task for task, _ in pending), return_exceptions=True)

    async def _search_and_probe(self, row: _Row, query: str | None, output: str) -> _Searched | None:
        """The turn's search (if it issued one) and its probe (if probing); the row joins the trajectory. The
        probe runs beside the next turns, or before them in the loop's schedule (with the search)."""
        prompt = self.protocol.probe_prompt(self.context, output) if self.agent.probe else None
        if prompt is not None and self.loop.probes_beside:
            self._probe_beside(row, prompt)
            searched = await self._retrieve(query) if query is not None else None
        else:
            search = asyncio.ensure_future(self._retrieve(query)) if query is not None else None
            await self.loop.schedule.search_and_probe(
                search, None if prompt is None else partial(self._probe, row, prompt)
            )
            searched = search.result() if search is not None else None
            self._append_row(row)
        if searched is not None:
            row["retrieval_s"] = searched.seconds
        return searched

    async def _retrieve(self, query: str) -> _Searched:
        started = time.monotonic()
        try:
            result, error = (await self.loop.retriever.search([query], self.loop.deep_k))[0], None
        except Exception as exc:  # noqa: BLE001 - reported when the trajectory reads it (a controller may stop first)
            result, error = None, exc
        return _Searched(query, result, error, time.monotonic() - started)

    def _read(self, searched: _Searched) -> _Retrieval:
        """The search's documents enter the context (the top ``top_k``; the row keeps the deep list)."""
        query, result = searched.query, searched.result
        if result is None:
            exc = searched.error
            reason = STOP_QUERY_CRASH if isinstance(exc, QueryCrashError) else STOP_RETRIEVAL_ERROR
            raise _Stop(reason, f"query {query!r}: {type(exc).__name__}: {exc}") from exc
        self.retrievals += 1
        if not result.hits and self.protocol.stops_on_empty_results:
            raise _Stop(STOP_NO_RESULTS, f"query {query!r}: no retrieval results")
        visible = min(self.loop.top_k, len(result.hits))
        self.context += self.protocol.observation(result.hits[:visible])
        return _Retrieval(query, result, visible)

    async def _forced_answer(self, pending: _Retrieval) -> None:
        """The turn budget is spent after a search: one forced answer reads the last documents."""
        await self._join_probes()  # its probe's utility needs the row before
        prompt = self.protocol.forced_answer_prompt(self.context)
        row = self._row(len(self.rows), pending, "", 0)
        if self.agent.probe:
            gen = await self._probe(row, prompt)
        else:
            gen = await self._generate(prompt, self.agent.probe_max_tokens, 0.0, (self.protocol.answer_close,))
            row["tokens_generated"] = len(gen.token_ids)
            _charge(row, gen)
        answer = self.protocol.parse_probe(gen.text)
        self._append_row(row)
        self.tail = prompt[len(self.context) :] + gen.text + self.protocol.answer_close
        if not await self._controller_stops():
            self.final_answer = answer

    async def _probe(self, row: _Row, prompt: str) -> Generation:
        """The probe of a row not yet in the trajectory, run before the trajectory goes on."""
        gen = await self._probe_generate(prompt)
        self._record_probe(row, gen)
        return gen

    async def _probe_generate(self, prompt: str) -> Generation:
        return await self._generate(
            prompt, self.agent.probe_max_tokens, 0.0, (self.protocol.answer_close,), logprobs=True
        )

    def _record_probe(self, row: _Row, gen: Generation) -> None:
        """The probe's columns; U_i against the row before ``row`` in the trajectory (or the last row)."""
        _charge(row, gen, probe=True)
        answer = self.protocol.parse_probe(gen.text)
        row["probe_answer"] = answer
        row["probe_token_logprobs"] = list(gen.token_logprobs or [])
        row["probe_tokens"] = len(gen.token_ids)
        row["probe_f1"] = self._score(answer)
        index = next((i for i, r in enumerate(self.rows) if r is row), len(self.rows))
        previous = self.rows[index - 1] if index > 0 else None
        if previous is not None and previous["probe_f1"] is not None and row["probe_f1"] is not None:
            row["utility"] = row["probe_f1"] - previous["probe_f1"]

    def _score(self, answer: str | None) -> float | None:
        """F1 of ``answer`` against the question's golden answers; None for a question without any (one asked
        live, ``raypipe serve-agent``: the loaders refuse a dataset question without them)."""
        golds = self.question.golden_answers
        return f1_score(answer, golds, self.agent.metric) if golds else None

    async def _controller_stops(self) -> bool:
        controller = self.loop.controller
        if controller is None:
            return False
        started = time.perf_counter()
        decision = await controller.decide(self.question.question, self._history())
        self.rows[-1]["decision_s"] = time.perf_counter() - started
        if not decision.stop:
            return False
        current = len(self.rows) - 1
        chosen = current if decision.answer_iteration is None else decision.answer_iteration
        if not 0 <= chosen <= current:
            raise ValueError(f"controller named iteration {chosen}; the trajectory has 0..{current}")
        self.final_answer, self.stop_reason = self.rows[chosen]["probe_answer"], STOP_CONTROLLER
        return True

    def _history(self) -> list[OnlineRow]:
        return [_online(row) for row in self.rows]

    async def _generate(
        self,
        prompt: str,
        max_tokens: int,
        temperature: float,
        stop: tuple[str, ...],
        regex: str | None = None,
        turn: int = 0,
        logprobs: bool = False,
    ) -> Generation:
        seed = None if temperature == 0 else (zlib.crc32(self.question.qid.encode()) + self.loop.seed + turn) % 2**31
        request = GenerationRequest(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            logprobs=logprobs,
            regex=regex,
            seed=seed,
        )
        try:  # engines clamp max_tokens to the room left and raise ContextOverflowError when there is none
            return await self.loop.engine.generate(request)
        except ContextOverflowError as exc:
            raise _Stop(STOP_CONTEXT, str(exc)) from exc
        except EngineDiedError:
            raise
        except EngineUnavailableError as exc:  # an outage: a rerun runs the question again
            raise _Stop(STOP_ENGINE_ERROR, str(exc)) from exc
        except EngineError as exc:  # the engine refused this request: sent again, it fails again
            raise _Stop(STOP_INTERNAL_ERROR, str(exc)) from exc

    def _row(self, turn: int, retrieval: _Retrieval | None, reasoning: str, tokens: int) -> _Row:
        hits = retrieval.result.hits if retrieval else []
        visible = hits[: retrieval.visible] if retrieval else []
        return {
            "qid": self.question.qid,
            "dataset": self.question.dataset,
            "iteration": turn,
            "query": retrieval.query if retrieval else None,
            "doc_ids": [h.doc_id for h in hits] if retrieval else None,
            "doc_scores": [float(h.score) for h in hits] if retrieval else None,
            "reasoning": reasoning,
            "probe_answer": None,
            "probe_token_logprobs": None,
            "probe_f1": None,
            "utility": None,
            "tokens_generated": tokens,
            "probe_tokens": 0,
            **_NO_COST,
            "_titles": [h.title for h in visible],
            "_texts": [h.text for h in visible],
        }

    def output(self, wall_s: float) -> TrajectoryOutput:
        for row in self.rows:
            cached = row["cached_tokens"]
            row["prefilled_tokens"] = None if cached is None else row["prompt_tokens"] - cached
        iterations = [_public(row) for row in self.rows]
        trajectory: TrajectoryRow = {
            "qid": self.question.qid,
            "dataset": self.question.dataset,
            "question": self.question.question,
            "golden_answers": list(self.question.golden_answers),
            "final_answer": self.final_answer,
            "final_f1": self._score(self.final_answer),
            "n_iterations": self.retrievals,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "tokens_generated": sum(r["tokens_generated"] for r in iterations),
            "probe_tokens": sum(r["probe_tokens"] for r in iterations),
            "wall_s": wall_s,
            "transcript": self.context[len(self.prompt) :] + self.tail,
            **trajectory_costs(iterations),
        }
        return TrajectoryOutput(trajectory, iterations)


# A row's cost before its requests are charged; null-able columns start at 0 and turn null when a request
# of the row does not report them (an unknown part makes the sum unknown).
_NO_COST: IterationCosts = {
    "prompt_tokens": 0,
    "cached_tokens": 0,
    "prefilled_tokens": 0,
    "probe_prompt_tokens": 0,
    "probe_cached_tokens": 0,
    "retrieval_s": None,
    "search_dropped": False,
    "queue_s": 0.0,
    "engine_s": 0.0,
    "decision_s": None,
}


_N = TypeVar("_N", int, float)


def _add(total: _N | None, part: _N | None) -> _N | None:
    return None if total is None or part is None else total + part


def _total(parts: list[_N | None]) -> _N | None:
    """The sum of ``parts``, null if any part is."""
    total: _N | None = 0
    for part in parts:
        total = _add(total, part)
    return total


def _charge(row: IterationRow, gen: Generation, probe: bool = False) -> None:
    """Add one request's engine cost to its row."""
    row["prompt_tokens"] += gen.prompt_tokens
    row["cached_tokens"] = _add(row["cached_tokens"], gen.cached_prompt_tokens)
    row["queue_s"] = _add(row["queue_s"], gen.queue_s)
    row["engine_s"] = _add(row["engine_s"], gen.engine_s)
    if probe:
        row["probe_prompt_tokens"] += gen.prompt_tokens
        row["probe_cached_tokens"] = _add(row["probe_cached_tokens"], gen.cached_prompt_tokens)


def trajectory_costs(iterations: list[IterationRow]) -> TrajectoryCosts:
    """The trajectory's cost columns: each iteration cost summed (null if any iteration's is; retrieval
    time over the iterations that searched), dropped searches counted."""
    return {
        "prompt_tokens": _total([r["prompt_tokens"] for r in iterations]),
        "cached_tokens": _total([r["cached_tokens"] for r in iterations]),
        "prefilled_tokens": _total([r["prefilled_tokens"] for r in iterations]),
        "probe_prompt_tokens": _total([r["probe_prompt_tokens"] for r in iterations]),
        "probe_cached_tokens": _total([r["probe_cached_tokens"] for r in iterations]),
        "retrieval_s": sum(r["retrieval_s"] for r in iterations if r["retrieval_s"] is not None),
        "queue_s": _total([r["queue_s"] for r in iterations]),
        "engine_s": _total([r["engine_s"] for r in iterations]),
        "searches_dropped": sum(r["search_dropped"] for r in iterations),
    }
