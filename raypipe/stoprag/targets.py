"""Stop-RAG cores (Park, Cho, Lee, arXiv 2510.14337): states, rewards, Q-network targets, the decision rule.

Iterative RAG as a finite-horizon MDP with no discounting. A state s_t is the question plus the documents
the agent has gathered by iteration t, one per iteration (:func:`state_text`, the reference's encoder input);
STOP ends the episode with reward r_t = the quality of the answer given at s_t, every state scored by one
answer generator (:mod:`raypipe.stoprag.rewards`; by default the probed answer's F1); CONT leads to s_{t+1}. The last
recorded iteration (natural termination or the turn limit) is terminal: only STOP is possible there.

Targets for the CONT head, as the public trainer (chosolbee/MHQA-SetVerify
``Training/multihead_stop_decider_train.py``) computes them for a state s_t with k bootstrappable future
states s_{t+1}..s_{t+k} and the terminal s_T (T = t+k+1):

- n-step return G_n (n = 1..k) = max(r_{t+1}, .., r_{t+n-1}, max(Q_stop, Q_cont)(s_{t+n})): stop at the best
  of the observed intermediate states or bootstrap at s_{t+n} (the bootstrap stands in for r_{t+n} too);
- Monte Carlo MC = max(r_{t+1}, .., r_T), the best stop reachable by continuing;
- full-width forward-view Q(lambda) = (1 - lambda) * sum_{n=1..k} lambda^(n-1) G_n + lambda^k MC
  (lambda = 1 is MC; lambda = 0 is the one-step Q(0) target G_1, or r_T when s_{t+1} is terminal);
- binary (the single-head ablation ``hard_diff``): label 1 when r_t >= MC, trained with BCE on the margin.

The STOP head always regresses r_t. The controller stops at the first iteration where
Q_stop - Q_cont > threshold, the threshold tuned on validation questions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from raypipe.core.config import PAPER_F1_SHARE

if TYPE_CHECKING:  # the replay (and its Arrow tables) loads where a controller is evaluated, not with the targets
    from raypipe.stopping.replay import OfflineController, Summary, Trajectory

TargetType = Literal["qlambda", "mc", "q0", "binary"]
TARGET_TYPES: tuple[TargetType, ...] = ("qlambda", "mc", "q0", "binary")
StateInput = Literal["docs", "trace"]


# ---------------------------------------------------------------- states

SEP = "[SEP]"  # the reference's separator when the tokenizer has none (Training/utils.py l.15)


@dataclass(frozen=True)
class Round:
    """What one retrieval iteration added: its query, the documents the agent saw (in rank order),
    reasoning, probed answer."""

    query: str | None
    docs: tuple[tuple[str, str, str], ...]  # (doc_id, title, text)
    reasoning: str | None = None
    answer: str | None = None


def with_documents(
    rows: Sequence[dict[str, Any]], docs: dict[str, tuple[str, str]], top_k: int
) -> list[dict[str, Any]]:
    """ITERATIONS rows plus ``doc_titles``/``doc_texts`` of their top ``top_k`` documents, as the online
    history carries them, from a doc_id -> (title, text) lookup."""
    out = []
    for row in rows:
        ids = list(row.get("doc_ids") or [])[:top_k] if row["iteration"] > 0 else []
        missing = [d for d in ids if d not in docs]
        if missing:
            raise KeyError(
                f"qid {row.get('qid')!r} iteration {row['iteration']}: documents {missing[:3]} not in the corpus"
            )
        out.append({**row, "doc_titles": [docs[d][0] for d in ids], "doc_texts": [docs[d][1] for d in ids]})
    return out


def rounds_from_history(history: Sequence[Mapping[str, Any]]) -> list[Round]:
    """The retrieval rounds (iterations >= 1, in order) of an online history or of rows from
    :func:`with_documents`."""
    ordered = sorted(history, key=lambda r: r["iteration"])
    its = [r["iteration"] for r in ordered]
    if its != list(range(len(its))):
        raise ValueError(f"iterations must be 0..n without gaps, got {its}")
    rounds = []
    for row in ordered[1:]:
        titles, texts = row.get("doc_titles") or [], row.get("doc_texts") or []
        ids = list(row.get("doc_ids") or [])[: len(titles)]
        ids += [f"{row['iteration']}:{k}" for k in range(len(ids), len(titles))]  # ids only dedupe documents
        rounds.append(
            Round(row.get("query"), tuple(zip(ids, titles, texts)), row.get("reasoning"), row.get("probe_answer"))
        )
    return rounds


def selected_documents(rounds: Sequence[Round], per_round: int | None = 1) -> list[tuple[tuple[str, str, str], ...]]:
    """The documents each round contributes to the state, as the reference selects them
    (chosolbee/MHQA-SetVerify ``pipeline/pipeline_sep.py`` l.77-94, ``max_docs=1``): the best-ranked
    documents not selected in an earlier round, then (when fewer are new) the round's top ones again,
    ``per_round`` in all (None: every visible document). The reference's docs-only history (l.85-87)
    skips a repeat; here a round whose documents were all seen repeats its top one, as the reference's
    trace shows it, so that every state differs from the one before."""
    seen: set[str] = set()
    out = []
    for rnd in rounds:
        k = len(rnd.docs) if per_round is None else per_round
        fresh = [d for d in rnd.docs if d[0] not in seen]
        chosen = (fresh + [d for d in rnd.docs if d[0] in seen])[:k]
        seen.update(d[0] for d in chosen)
        out.append(tuple(chosen))
    return out


def state_text(
    question: str,
    rounds: Sequence[Round],
    mode: StateInput = "docs",
    doc_chars: int | None = None,
    per_round: int | None = 1,
    sep: str = SEP,
) -> str:
    """The Q-network's input for a state, as the reference's encoder input (``Training/utils.py``
    ``convert_chat_to_text`` l.15-37 over the prompts of ``multihead_stop_decider_train.py`` l.52-58):
    parts joined by the tokenizer's separator, without spaces.

    ``docs`` (the reference's ``--use-docs-only``, its README's training command):
    ``question[SEP]title: text[SEP]title: text...``, one part per selected document
    (:func:`selected_documents`; a round that retrieved nothing adds an empty part, so the state
    still changes). ``trace`` (its default without the flag): per round ``Follow up: query``, each
    ``Document: title: text`` and ``Intermediate answer: probed answer`` as parts. Documents are the
    full text unless ``doc_chars`` cuts them (an option; the reference keeps all of it).
    """
    parts = [question.strip()]
    for rnd, docs in zip(rounds, selected_documents(rounds, per_round)):
        texts = [f"{title}: {_squash(text, doc_chars)}" for _, title, text in docs]
        if mode == "trace":
            parts.append(f"Follow up: {(rnd.query or '').strip()}")
            parts += [f"Document: {t}" for t in texts]
            parts.append(f"Intermediate answer: {(rnd.answer or '').strip()}")
        else:
            parts += texts or [""]
    return sep.join(parts)


def _squash(text: str, limit: int | None) -> str:
    text = " ".join(text.split())
    return text if limit is None else text[:limit]


@dataclass(frozen=True)
class Episode:
    """One recorded trajectory as states s_first..s_T with their STOP rewards; s_T is terminal."""

    qid: str
    iterations: tuple[int, ...]
    texts: tuple[str, ...]
    rewards: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (len(self.iterations) == len(self.texts) == len(self.rewards)) or not self.iterations:
            raise ValueError(f"episode {self.qid!r}: iterations, texts and rewards must be non-empty and aligned")


def build_episode(
    qid: str,
    question: str,
    rows: Sequence[dict[str, Any]],
    *,
    first_decision: int = 1,
    mode: StateInput = "docs",
    doc_chars: int | None = None,
    per_round: int | None = 1,
    sep: str = SEP,
    rewards: dict[int, float] | None = None,
) -> Episode:
    """An episode from one question's rows (any order) carrying ``doc_titles``/``doc_texts``.

    States start at ``first_decision`` (1: after the first retrieval, as in Stop-RAG; 0 adds the
    no-retrieval probe). A trajectory that ended before ``first_decision`` keeps its last state only.
    ``rewards`` (iteration -> reward) come from one answer generator for every state, the terminal one
    included (:mod:`raypipe.stoprag.rewards`); without them, each iteration's probe F1.
    """
    try:
        rounds = rounds_from_history(rows)
    except ValueError as exc:
        raise ValueError(f"qid {qid!r}: {exc}") from None
    ordered = sorted(rows, key=lambda r: r["iteration"])
    last = len(ordered) - 1
    keep = [i for i in range(len(ordered)) if i >= first_decision or i == last]
    scores = rewards if rewards is not None else probe_rewards(ordered)
    return Episode(
        qid,
        tuple(keep),
        tuple(state_text(question, rounds[:i], mode, doc_chars, per_round, sep) for i in keep),
        tuple(scores[i] for i in keep),
    )


def probe_rewards(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    """iteration -> the probed answer's F1 (a probe that produced nothing scores 0, as in the shared
    evaluator)."""
    return {r["iteration"]: float(r.get("probe_f1") or 0.0) for r in rows}


# ---------------------------------------------------------------- training samples


@dataclass(frozen=True)
class Sample:
    """A non-terminal state s_t: its index in the state table, r_t, and what follows it."""

    state: int
    reward: float  # r_t, the STOP head's target
    future_rewards: tuple[float, ...]  # r_{t+1} .. r_T (the last one terminal)
    future_states: tuple[int, ...]  # state indices of s_{t+1} .. s_{T-1}: the bootstrappable ones


def training_samples(episodes: Sequence[Episode], drop_no_signal: bool = True) -> tuple[list[str], list[Sample]]:
    """The state table (every state's text) and one sample per non-terminal state.

    ``drop_no_signal`` drops states whose own and future rewards are all zero (as the public trainer
    does: nothing to learn about when to stop); their texts stay in the table for bootstrapping.
    """
    texts: list[str] = []
    samples: list[Sample] = []
    for ep in episodes:
        base = len(texts)
        texts.extend(ep.texts)
        last = len(ep.texts) - 1
        for t in range(last):
            future = ep.rewards[t + 1 :]
            if drop_no_signal and max(ep.rewards[t], *future) <= 0.0:
                continue
            samples.append(Sample(base + t, ep.rewards[t], tuple(future), tuple(range(base + t + 1, base + last))))
    return texts, samples


# ---------------------------------------------------------------- targets


def mc_target(future_rewards: Sequence[float]) -> float:
    """The best STOP reward reachable by continuing: max(r_{t+1}, .., r_T)."""
    if not future_rewards:
        raise ValueError("a non-terminal state needs at least the terminal reward after it")
    return max(future_rewards)


def nstep_returns(future_rewards: Sequence[float], bootstrap: Sequence[float]) -> list[float]:
    """G_1..G_k: G_n = max(r_{t+1..t+n-1}, bootstrap[n-1]), bootstrap[j] = max(Q_stop, Q_cont)(s_{t+1+j})."""
    if len(bootstrap) != len(future_rewards) - 1:
        raise ValueError(
            f"{len(future_rewards)} future rewards need {len(future_rewards) - 1} bootstrap values, got "
            f"{len(bootstrap)}"
        )
    returns, best = [], -math.inf
    for n, value in enumerate(bootstrap):
        returns.append(max(best, value))
        best = max(best, future_rewards[n])
    return returns


def qlambda_target(future_rewards: Sequence[float], bootstrap: Sequence[float], lam: float) -> float:
    """Full-width forward-view Q(lambda): (1-lam) sum_n lam^(n-1) G_n + lam^k MC."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    returns = nstep_returns(future_rewards, bootstrap)
    mixed = sum(lam**n * g for n, g in enumerate(returns))
    return (1.0 - lam) * mixed + lam ** len(returns) * mc_target(future_rewards)


def q0_target(future_rewards: Sequence[float], bootstrap: Sequence[float]) -> float:
    """One-step Q-learning: max(Q_stop, Q_cont)(s_{t+1}), or r_T when s_{t+1} is terminal."""
    return qlambda_target(future_rewards, bootstrap, 0.0)


def binary_label(reward: float, future_rewards: Sequence[float]) -> float:
    """1.0 when stopping now is at least as good as the best continuation (the ``hard_diff`` ablation)."""
    return float(reward >= mc_target(future_rewards))


def cont_target(target: TargetType, sample: Sample, bootstrap: Sequence[float], lam: float) -> float:
    """The CONT head's target for one sample (for ``binary``, the label of the margin)."""
    if target == "qlambda":
        return qlambda_target(sample.future_rewards, bootstrap, lam)
    if target == "q0":
        return q0_target(sample.future_rewards, bootstrap)
    if target == "mc":
        return mc_target(sample.future_rewards)
    if target == "binary":
        return binary_label(sample.reward, sample.future_rewards)
    raise ValueError(f"unknown target type {target!r}; one of {', '.join(TARGET_TYPES)}")


def needs_bootstrap(target: TargetType) -> bool:
    return target in ("qlambda", "q0")


def cosine_lambda(step: int, total_steps: int, start: float = 1.0, end: float = 0.1) -> float:
    """lambda annealed from ``start`` to ``end`` over ``total_steps`` along a half cosine."""
    if total_steps <= 0:
        return start
    progress = min(max(step, 0) / total_steps, 1.0)
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- decisions


def first_stop(margins: Sequence[float], threshold: float) -> int:
    """Position of the first state whose margin Q_stop - Q_cont exceeds ``threshold`` (strictly); the
    last (terminal) state when none does. ``margins`` covers every state of the episode, terminal last."""
    if not margins:
        raise ValueError("an episode has at least one state")
    for pos, margin in enumerate(margins[:-1]):
        if margin > threshold:
            return pos
    return len(margins) - 1


Margins = dict[str, dict[int, float]]  # qid -> iteration -> Q_stop - Q_cont


def margin_controller(margins: Margins, threshold: float, reason: str = "stoprag") -> OfflineController:
    """Stop-RAG as an offline controller (:mod:`raypipe.stopping.replay`): stop after the first iteration
    whose margin exceeds ``threshold`` and return that iteration's probed answer; otherwise natural.
    Iterations without a margin (before ``first_decision``, or the terminal one) never stop. Any per-
    iteration score works (LLM-Stop replays its decisions as margins 1/0 with threshold 0.5)."""
    from raypipe.stopping.replay import Decision, natural_decision

    def controller(trajectory: Trajectory) -> Decision:
        per_it = margins.get(trajectory.qid)
        if per_it is None:
            raise ValueError(f"no {reason} margins for question {trajectory.qid}")
        its = sorted(i for i in per_it if i < trajectory.n_iterations)
        pos = first_stop([per_it[i] for i in its] + [math.inf], threshold)  # the terminal never counts
        if pos < len(its):
            return Decision(decision_iteration=its[pos], answer_iteration=its[pos], reason=reason)
        return natural_decision(trajectory)

    return controller


def candidate_thresholds(margins: Margins) -> list[float]:
    """Every threshold that changes some decision: below all margins (stop at once), midpoints between
    sorted distinct margins, and the largest margin (never stop early)."""
    values = sorted({float(m) for per_it in margins.values() for m in per_it.values()})
    if not values:
        return [0.0]
    mids = [(a + b) / 2 for a, b in zip(values, values[1:])]
    return [values[0] - 1.0, *mids, values[-1]]


def tune_threshold(
    trajectories: Sequence[Trajectory],
    margins: Margins,
    objective: Literal["reward", "share"] = "reward",
    min_share: float = PAPER_F1_SHARE,
) -> tuple[float, Summary]:
    """Pick the threshold on validation trajectories; returns it and its validation summary.

    ``reward``: the highest mean F1 (ties: fewer iterations), the paper's accuracy criterion.
    ``share``: the fewest iterations keeping at least ``min_share`` of natural stopping's mean F1
    (when no threshold does, the best F1).
    """
    from raypipe.stopping.replay import evaluate

    if not trajectories:
        raise ValueError("no validation trajectories to tune the threshold on")
    best: tuple[tuple[float, ...], float, Summary] | None = None
    for thr in candidate_thresholds(margins):
        summary = evaluate("stoprag", trajectories, margin_controller(margins, thr))
        if objective == "reward":
            key = (summary.mean_f1, -summary.mean_iterations, thr)
        else:
            ok = summary.mean_f1 >= min_share * summary.natural_f1 - 1e-12
            key = (float(ok), -summary.mean_iterations if ok else summary.mean_f1, summary.mean_f1, thr)
        if best is None or key > best[0]:
            best = (key, thr, summary)
    assert best is not None
    return best[1], best[2]
