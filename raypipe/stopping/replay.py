"""Replay any stopping controller offline on recorded trajectories, and score it.

The API is generic so that every controller (the 4-state heuristic, caps, Stop-RAG, LLM-Stop) is
scored the same way:

- a :class:`Trajectory` is one recorded question: its probed answers' F1 per iteration (P_0..P_n),
  the tokens each iteration cost, and the natural ending's F1 and tokens (and, read from a run, the same
  answers' exact match, for the paired tests; controllers decide on F1 and costs only);
- an *offline controller* is any callable ``Trajectory -> Decision``; it sees the recorded trajectory
  (look up your own per-qid inputs, e.g. predictions, by ``trajectory.qid``) and says at which
  iteration it decided and whose probed answer it returns;
- :func:`replay` applies a controller to every trajectory and returns one :class:`Outcome` each;
  :func:`summarise` reduces outcomes to a :class:`Summary` against natural stopping on the same
  questions; :func:`evaluate` does both.

Cost accounting (the seed paper's): the cost is counted up to the iteration where the decision is
taken, even when a rollback returns an earlier answer. Iterations are retrieval iterations (iteration
0 is the probe before any retrieval), so deciding after iteration d costs d iterations, and the tokens
of iterations 0..d (agent + probe tokens). A decision at or past the last iteration is natural
termination and costs what the recorded trajectory cost. ``Decision.answer_iteration=None`` returns the
natural final answer (``final_f1``); otherwise the probed answer of that iteration (``probe_f1``), and
the same answer's exact match where the trajectory has it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from raypipe.core.metrics import DEFAULT_RULE, Rule, exact_match
from raypipe.core.rundir import RunDir
from raypipe.core.schema import (
    STOP_CONTROLLER,
    STOP_ENGINE_CRASH,
    STOP_ENGINE_ERROR,
    STOP_INTERNAL_ERROR,
    STOP_QUERY_CRASH,
    STOP_RETRIEVAL_ERROR,
)

log = logging.getLogger(__name__)

# Trajectories with no natural outcome to compare against: infrastructure failures, and trajectories an
# online controller already cut short.
EXCLUDED_STOP_REASONS = (
    STOP_ENGINE_ERROR,
    STOP_ENGINE_CRASH,
    STOP_RETRIEVAL_ERROR,
    STOP_INTERNAL_ERROR,
    STOP_QUERY_CRASH,
    STOP_CONTROLLER,
)


@dataclass(frozen=True)
class Trajectory:
    qid: str
    dataset: str
    probe_f1: tuple[float, ...]  # P_i for i = 0..n (index = iteration)
    iteration_tokens: tuple[int, ...]  # agent + probe tokens of each iteration 0..n
    final_f1: float  # F1 of the answer at natural termination
    total_tokens: int  # agent + probe tokens of the whole recorded trajectory
    probe_em: tuple[float, ...] | None = None  # exact match of each probed answer, where known
    final_em: float | None = None  # exact match of the natural final answer, where known

    def __post_init__(self):
        if not self.probe_f1:
            raise ValueError(f"trajectory {self.qid}: no iterations")
        if len(self.iteration_tokens) != len(self.probe_f1):
            raise ValueError(
                f"trajectory {self.qid}: {len(self.iteration_tokens)} token counts for {len(self.probe_f1)} iterations"
            )
        if self.probe_em is not None and len(self.probe_em) != len(self.probe_f1):
            raise ValueError(
                f"trajectory {self.qid}: {len(self.probe_em)} EM values for {len(self.probe_f1)} iterations"
            )

    @property
    def n_iterations(self) -> int:
        """Retrieval iterations performed at natural termination."""
        return len(self.probe_f1) - 1


@dataclass(frozen=True)
class Decision:
    decision_iteration: int  # the iteration after which the controller decided (cost counted up to it)
    answer_iteration: int | None = None  # whose probed answer is returned; None = the natural final answer
    reason: str = ""


OfflineController = Callable[[Trajectory], Decision]


def natural_decision(trajectory: Trajectory, reason: str = "natural") -> Decision:
    return Decision(decision_iteration=trajectory.n_iterations, answer_iteration=None, reason=reason)


@dataclass(frozen=True)
class Outcome:
    qid: str
    dataset: str
    decision_iteration: int
    answer_iteration: int | None
    reason: str
    iterations: int  # cost in retrieval iterations
    tokens: int  # cost in generated tokens (agent + probes)
    f1: float  # F1 of the returned answer
    natural_iterations: int
    natural_tokens: int
    natural_f1: float
    em: float | None = None  # exact match of the returned answer (None: the trajectory has no EM)
    natural_em: float | None = None


def outcome(trajectory: Trajectory, decision: Decision) -> Outcome:
    """Score one decision on its trajectory (the cost accounting of the module docstring)."""
    n = trajectory.n_iterations
    d, a = decision.decision_iteration, decision.answer_iteration
    if d < 0:
        raise ValueError(f"{trajectory.qid}: decision iteration {d} < 0")
    if a is not None and not 0 <= a <= min(d, n):
        raise ValueError(f"{trajectory.qid}: answer iteration {a} outside 0..{min(d, n)} (decision at {d}, n={n})")
    natural = d >= n
    return Outcome(
        qid=trajectory.qid,
        dataset=trajectory.dataset,
        decision_iteration=min(d, n),
        answer_iteration=a,
        reason=decision.reason,
        iterations=min(d, n),
        tokens=trajectory.total_tokens if natural else sum(trajectory.iteration_tokens[: d + 1]),
        f1=trajectory.final_f1 if a is None else trajectory.probe_f1[a],
        natural_iterations=n,
        natural_tokens=trajectory.total_tokens,
        natural_f1=trajectory.final_f1,
        em=_returned_em(trajectory, a),
        natural_em=trajectory.final_em,
    )


def _returned_em(trajectory: Trajectory, answer_iteration: int | None) -> float | None:
    if answer_iteration is None:
        return trajectory.final_em
    return None if trajectory.probe_em is None else trajectory.probe_em[answer_iteration]


def replay(trajectories: Iterable[Trajectory], controller: OfflineController) -> list[Outcome]:
    return [outcome(t, controller(t)) for t in trajectories]


def outcome_rows(controller: str, outcomes: Iterable[Outcome]) -> list[dict]:
    """Per-question outcomes as table rows, each with the ``controller`` that produced it (the paired tests'
    input: :mod:`raypipe.analysis.policy_tests`)."""
    return [{**asdict(o), "controller": controller} for o in outcomes]


def relative_change(value, natural):
    """value / natural - 1 (0 where natural is 0); scalars or arrays (sums or means alike)."""
    value, natural = np.asarray(value, dtype=float), np.asarray(natural, dtype=float)
    out = np.divide(value, natural, out=np.ones(np.broadcast(value, natural).shape), where=natural > 0) - 1
    return out if out.ndim else float(out)


def share(value, natural):
    """value / natural (NaN where natural is 0); scalars or arrays."""
    value, natural = np.asarray(value, dtype=float), np.asarray(natural, dtype=float)
    out = np.divide(value, natural, out=np.full(np.broadcast(value, natural).shape, np.nan), where=natural > 0)
    return out if out.ndim else float(out)


@dataclass(frozen=True)
class Summary:
    name: str
    questions: int
    mean_iterations: float
    mean_f1: float
    natural_iterations: float
    natural_f1: float
    mean_tokens: float
    natural_tokens: float

    @property
    def iterations_change(self) -> float:
        """Relative change of mean iterations against natural stopping (the paper's -10.89%)."""
        return relative_change(self.mean_iterations, self.natural_iterations)

    @property
    def f1_share(self) -> float:
        """Mean F1 as a share of natural stopping's (the paper's 97.60%)."""
        return share(self.mean_f1, self.natural_f1)

    @property
    def tokens_saved(self) -> float:
        """Share of natural stopping's generated tokens that were not spent."""
        return -relative_change(self.mean_tokens, self.natural_tokens)

    def row(self) -> dict:
        return {
            "controller": self.name,
            "questions": self.questions,
            "mean_iterations": self.mean_iterations,
            "iterations_change": self.iterations_change,
            "mean_f1": self.mean_f1,
            "f1_share": self.f1_share,
            "mean_tokens": self.mean_tokens,
            "tokens_saved": self.tokens_saved,
        }


def summarise(name: str, outcomes: Sequence[Outcome]) -> Summary:
    if not outcomes:
        raise ValueError(f"{name}: no outcomes to summarise")
    k = len(outcomes)
    return Summary(
        name=name,
        questions=k,
        mean_iterations=sum(o.iterations for o in outcomes) / k,
        mean_f1=sum(o.f1 for o in outcomes) / k,
        natural_iterations=sum(o.natural_iterations for o in outcomes) / k,
        natural_f1=sum(o.natural_f1 for o in outcomes) / k,
        mean_tokens=sum(o.tokens for o in outcomes) / k,
        natural_tokens=sum(o.natural_tokens for o in outcomes) / k,
    )


def evaluate(name: str, trajectories: Sequence[Trajectory], controller: OfflineController) -> Summary:
    return summarise(name, replay(trajectories, controller))


def split_qids(qids: Iterable[str], val_fraction: float, seed: int = 0) -> tuple[set[str], set[str]]:
    """Deterministic (validation, test) split by question, from a hash of ``seed`` and the qid."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    val: set[str] = set()
    test: set[str] = set()
    for qid in qids:
        h = int.from_bytes(hashlib.sha256(f"{seed}:{qid}".encode()).digest()[:8], "big") / 2**64
        (val if h < val_fraction else test).add(qid)
    return val, test


def trajectories_from_tables(
    iterations: pa.Table, trajectories: pa.Table, rule: Rule = DEFAULT_RULE
) -> tuple[list[Trajectory], dict[str, int]]:
    """Build :class:`Trajectory` records from the ITERATIONS and TRAJECTORIES tables; exact match is scored
    here (the tables store F1 only) under ``rule``, the run's ``agent.metric``.

    Returns the records and counts of the trajectories left out (by reason). A missing probe F1 (a
    probe that produced nothing) counts as 0.
    """
    columns = ["qid", "iteration", "probe_f1", "probe_answer", "tokens_generated", "probe_tokens"]
    its = iterations.select(columns).to_pylist()
    by_qid: dict[str, dict[int, dict]] = {}
    for row in its:
        by_qid.setdefault(row["qid"], {})[row["iteration"]] = row
    records: list[Trajectory] = []
    excluded: dict[str, int] = {}
    for t in trajectories.to_pylist():
        qid = t["qid"]
        if t["stop_reason"] in EXCLUDED_STOP_REASONS:
            excluded[t["stop_reason"]] = excluded.get(t["stop_reason"], 0) + 1
            continue
        rows = by_qid.get(qid, {})
        if not rows:
            excluded["no_iterations"] = excluded.get("no_iterations", 0) + 1
            continue
        n = max(rows)
        if sorted(rows) != list(range(n + 1)):
            raise ValueError(f"trajectory {qid}: iterations {sorted(rows)} are not 0..{n}")
        ordered = [rows[i] for i in range(n + 1)]
        iteration_tokens = tuple((r["tokens_generated"] or 0) + (r["probe_tokens"] or 0) for r in ordered)
        total = (t["tokens_generated"] or 0) + (t["probe_tokens"] or 0)
        final_f1 = t["final_f1"] if t["final_f1"] is not None else 0.0
        golds = list(t["golden_answers"])
        records.append(
            Trajectory(
                qid=qid,
                dataset=t["dataset"],
                probe_f1=tuple(float(r["probe_f1"] or 0.0) for r in ordered),
                iteration_tokens=iteration_tokens,
                final_f1=float(final_f1),
                total_tokens=max(total, sum(iteration_tokens)),
                probe_em=tuple(exact_match(r["probe_answer"], golds, rule) for r in ordered),
                final_em=exact_match(t["final_answer"], golds, rule),
            )
        )
    if excluded:
        log.warning("left out of stopping evaluation: %s", excluded)
    return records, excluded


def load_trajectories(run_dir: str | RunDir) -> tuple[list[Trajectory], dict[str, int]]:
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    return trajectories_from_tables(run.read("iterations"), run.read("trajectories"), run.metric_rule())
