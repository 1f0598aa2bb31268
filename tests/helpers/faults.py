"""Fault injection for the reliability cases (tests/helpers/chaos.py).

A fault with a marker file fires once: the first time its trigger is seen it creates the file, and a
retry (a restarted actor, a resumed training run) finds it and goes on. Those that stand for an input
that crashes its process every time (``ScriptedAgents`` and ``KillEngineCore`` without a marker,
``PoisonQuery`` inside a retrieval replica) fire whenever they see it. The classes are picklable, so
they travel to Ray actors and workers (by value: ``tests.helpers.local_ray.init_local_ray``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raypipe.core.config import EngineConfig
from raypipe.llm.base import EngineDiedError, EngineUnavailableError, Generation, GenerationRequest
from raypipe.llm.vllm_engine import VLLMEngine, process_running
from raypipe.retrieval.types import SearchResult
from raypipe.testing.fakes import FakeEngine

DOC_1 = 'Doc 1(Title: "'  # the first document shown, in Search-R1's observation format


def fire_once(marker: str | Path) -> bool:
    """True the first time for ``marker`` (creating it), False afterwards; atomic across processes."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def question_of(prompt: str) -> str:
    """The question in a Search-R1 prompt (after ``Question: ``, up to the question mark the prompt adds)."""
    return prompt.split("Question: ", 1)[1].split("\n", 1)[0].removesuffix("?")


class ScriptedAgents:
    """Engine factory (picklable): every question searches its own text once, then answers it.

    The answer is the first retrieved document's title, so it depends on what retrieval returned; the
    probe before any retrieval answers ``unknown``. ``crash_on``: the engine's process exits (as an
    out-of-memory kill would) the first time it sees that question (with a ``marker`` file; without one,
    every time). ``error_on``: the engine cannot answer
    (``EngineUnavailableError``, an outage: the row's ``engine_error``) on that question's turns. ``die_on``: the engine
    dies (``EngineDiedError``) on every turn of that question. ``delay_s``: every agent turn blocks that long, to keep a
    job running while a test interrupts it.
    """

    def __init__(
        self,
        crash_on: str | None = None,
        marker: str | Path | None = None,
        error_on: str | None = None,
        delay_s: float = 0.0,
        die_on: str | None = None,
    ):
        if crash_on is None and marker is not None:
            raise ValueError("a marker file needs crash_on")
        self.crash_on, self.marker, self.error_on, self.delay_s = crash_on, marker, error_on, delay_s
        self.die_on = die_on

    def __call__(self, config: EngineConfig) -> FakeEngine:
        return FakeEngine(self.script, max_model_len=config.max_model_len)

    def script(self, request: GenerationRequest) -> str:
        question = question_of(request.prompt)
        after_search = DOC_1 in request.prompt
        if request.prompt.endswith("<answer>"):
            return f" {first_title(request.prompt)} </answer>" if after_search else " unknown </answer>"
        if question == self.crash_on and (self.marker is None or fire_once(self.marker)):
            os._exit(1)
        if question == self.error_on:
            raise EngineUnavailableError("injected engine outage")
        if question == self.die_on:
            raise EngineDiedError("injected engine death")
        time.sleep(self.delay_s)
        if after_search:
            return f"<think> found it </think>\n<answer> {first_title(request.prompt)} </answer>"
        return f"<think> look it up </think>\n<search> {question} </search>"


def first_title(prompt: str) -> str:
    """The title of the first document shown to the agent (Search-R1's observation format)."""
    return prompt.split(DOC_1, 1)[1].split('")', 1)[0]


class KillEngineCore:
    """Engine factory (picklable): the real vLLM engine, whose EngineCore process is SIGKILLed (as the
    kernel's out-of-memory killer would) just before a prompt containing ``trigger`` is sent to it. With
    a ``marker`` file the kill happens once in the whole job; without one, every time (a question that
    kills its engine whenever it runs). An engine whose core is already dead gets the request as it is,
    and reports its own death."""

    def __init__(self, trigger: str, marker: str | Path | None = None):
        self.trigger, self.marker = trigger, marker

    def __call__(self, config: EngineConfig) -> VLLMEngine:
        return _CoreKillingVLLMEngine(config, self)


class _CoreKillingVLLMEngine(VLLMEngine):
    def __init__(self, config: EngineConfig, fault: KillEngineCore):
        super().__init__(config)
        self.fault = fault

    async def generate(self, request: GenerationRequest) -> Generation:
        fault = self.fault
        if fault.trigger in request.prompt:
            pids = self.core_pids()
            # the once-only kill waits for a request that finds a live core to kill (one sent while this engine has
            # none listed, as in one CI run, would use up the marker and kill nothing)
            if fault.marker is None or (pids and fire_once(fault.marker)):
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                while any(process_running(pid) for pid in pids):  # gone before the request is sent
                    await asyncio.sleep(0.01)
                if fault.marker is not None:  # which process was killed, for the test to check
                    Path(fault.marker).write_text(" ".join(map(str, pids)))
        return await super().generate(request)


class KillReplicaOnce:
    """A ``Retriever`` around a retrieval client: SIGKILLs the replica's process before the first search
    whose queries contain ``trigger``, then sends that search to it (so Ray must restart the actor and
    retry the call)."""

    def __init__(self, client, trigger: str, marker: str | Path):
        self.client, self.trigger, self.marker = client, trigger, marker

    async def search(self, queries, k: int) -> list[SearchResult]:
        if any(self.trigger in q for q in queries) and fire_once(self.marker):
            for actor in self.client.actors:
                pid = await actor.__ray_call__.remote(_pid)
                os.kill(pid, signal.SIGKILL)
        return await self.client.search(queries, k)


class KillReplicaInFlight:
    """A ``Retriever`` around a retrieval client with one replica: the first time a search's queries contain
    ``trigger`` (once in the job: ``marker``), sends it, SIGKILLs the replica ``after_s`` later while the
    search waits in its batcher (run the service with ``retrieval.actors.max_wait_ms`` well above ``after_s``),
    then awaits the answer. A query that kills every replica it reaches is :class:`PoisonQuery`."""

    def __init__(self, client, trigger: str, marker: str | Path, after_s: float = 0.1):
        if len(client.actors) != 1:
            raise ValueError("KillReplicaInFlight needs a service with one replica")
        self.client, self.trigger, self.marker, self.after_s = client, trigger, marker, after_s

    async def search(self, queries, k: int) -> list[SearchResult]:
        if not any(self.trigger in q for q in queries) or not fire_once(self.marker):
            return await self.client.search(queries, k)
        replica = self.client.actors[0]
        pid = await replica.__ray_call__.remote(_pid)
        pending = asyncio.ensure_future(self.client.search(queries, k))
        await asyncio.sleep(self.after_s)
        if pending.done():
            raise RuntimeError("the search finished before the replica was killed: raise retrieval.actors.max_wait_ms")
        os.kill(pid, signal.SIGKILL)
        return await pending


def _pid(_actor: Any) -> int:
    return os.getpid()


class PoisonQuery:
    """A retrieval replica's search fault (picklable; ``start_retrieval_service(..., search_fault=...)``):
    the replica's process exits (``os._exit``, as a crash in the encoder or FAISS would) whenever a search
    it runs holds the query ``poison`` (exact text), every time. Each search call the replicas make is
    logged to ``log`` (JSON lines: ``pid``, ``queries``, ``killed``) before it runs, so a test can see which
    queries shared a batch with the poison and that it ran alone at the end."""

    def __init__(self, poison: str, log: str | Path):
        self.poison, self.log = poison, str(log)

    def __call__(self, queries: list[str]) -> None:
        killed = self.poison in queries
        with open(self.log, "a") as fh:  # one short write a line (O_APPEND): whole lines across processes
            fh.write(json.dumps({"pid": os.getpid(), "queries": list(queries), "killed": killed}) + "\n")
        if killed:
            os._exit(1)

    def calls(self) -> list[dict]:
        """Every search call logged so far, in order."""
        path = Path(self.log)
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FailTrainingOnce:
    """A Ray Train loop (picklable) that runs ``module.name`` and kills rank 0's process once, just before
    its ``die_at``-th ``ray.train.report``; every report and every start is logged to ``log`` (JSON lines).

    ``ray.train.report`` is wrapped inside the worker, so the loop under test runs unchanged.
    """

    def __init__(self, module: str, name: str, die_at: int, log: str | Path):
        self.module, self.name, self.die_at, self.log = module, name, die_at, Path(log)
        self.marker = self.log.with_suffix(".fired")

    def __call__(self, config: dict) -> None:
        import ray.train

        loop: Callable[[dict], None] = getattr(importlib.import_module(self.module), self.name)
        rank = ray.train.get_context().get_world_rank()
        if rank == 0:
            self._write({"event": "start", "resumed": ray.train.get_checkpoint() is not None})
        original, calls = ray.train.report, 0

        def report(metrics: dict, *args, **kwargs) -> None:
            nonlocal calls
            calls += 1
            if rank == 0 and calls == self.die_at and fire_once(self.marker):
                os._exit(1)
            if rank == 0:
                self._write({"event": "report", **{k: metrics[k] for k in ("task", "epoch") if k in metrics}})
            original(metrics, *args, **kwargs)

        ray.train.report = report
        try:
            loop(config)
        finally:
            ray.train.report = original

    def _write(self, event: dict) -> None:
        with self.log.open("a") as fh:
            fh.write(json.dumps(event) + "\n")

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []
