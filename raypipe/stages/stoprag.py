"""The Stop-RAG stage (jobs/stoprag.py): train the Q-network, tune its threshold, compare controllers.

Reads ``iterations/`` and ``trajectories/`` (and ``predictions/`` for the 4-state heuristic, when the
predictors have run) and writes ``RUN_DIR/stoprag/``:

- ``qnet/``: the trained network with its tuned threshold (loadable by :class:`StopRagController`);
  ``qnet_<target>/`` for ablation targets (Ray Train's checkpoints live in ``ray_train/`` while it runs);
- ``comparison.csv``/``.md``/``.png``: natural, Cap@k, the heuristic, Stop-RAG (and its target
  ablations) and LLM-Stop on the test questions: mean iterations, F1, share of natural F1, tokens;
- ``outcomes.parquet``: every controller's decision per test question; ``margins.parquet``: Q_stop,
  Q_cont and the reward of every scored state; ``llm_stop.parquet``: LLM-Stop's raw outputs;
- ``training.csv``: per-epoch loss and lambda of each trained network.

Questions are split by qid hash into train/val/test (``stoprag.split``); the threshold is tuned on val.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from raypipe.core.config import EngineConfig, RunConfig, StopRagConfig
from raypipe.core.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.llm.base import Engine
from raypipe.runtime.cluster import init_ray
from raypipe.stopping.caps import cap, natural
from raypipe.stopping.replay import (
    OfflineController,
    Summary,
    Trajectory,
    load_trajectories,
    replay,
    split_qids,
    summarise,
)
from raypipe.stoprag.targets import (
    Episode,
    Margins,
    build_episode,
    margin_controller,
    rounds_from_history,
    training_samples,
    tune_threshold,
    with_documents,
)

log = logging.getLogger(__name__)

OUT_DIR = "stoprag"


@dataclass(frozen=True)
class Splits:
    train: set[str]
    val: set[str]
    test: set[str]


def split_three(qids: Sequence[str], shares: tuple[float, float, float], seed: int) -> Splits:
    """train/val/test by qid hash, through the shared evaluator's two-way split applied twice."""
    rest, train = split_qids(qids, 1.0 - shares[0], seed)
    val, test = split_qids(sorted(rest), shares[1] / (shares[1] + shares[2]), seed + 1)
    return Splits(train, val, test)


def load_documents(corpus: str, wanted: set[str]) -> dict[str, tuple[str, str]]:
    """doc_id -> (title, text) for the wanted ids, streamed from the corpus jsonl."""
    from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus

    docs = {}
    for passage in iter_corpus(BUNDLED_CORPUS if corpus == "bundled" else corpus):
        if passage.doc_id in wanted:
            docs[passage.doc_id] = (passage.title, passage.text)
            if len(docs) == len(wanted):
                break
    return docs


def load_histories(run: RunDir, config: RunConfig, qids: set[str]) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Questions and per-qid iteration rows with their visible documents' titles and texts."""
    from raypipe.agents import loop_settings

    top_k = config.stoprag.docs_per_iteration or loop_settings(config).top_k  # what the agent saw
    questions = dict(zip(*run.read("trajectories", ["qid", "question"]).to_pydict().values()))
    rows: dict[str, list[dict]] = {}
    for row in run.read("iterations").to_pylist():
        if row["qid"] in qids:
            rows.setdefault(row["qid"], []).append(row)
    wanted = {d for rs in rows.values() for r in rs if r["iteration"] > 0 for d in (r["doc_ids"] or [])[:top_k]}
    docs = load_documents(config.data.corpus, wanted)
    return questions, {qid: with_documents(rs, docs, top_k) for qid, rs in rows.items()}


def score_episodes(folder: Path, episodes: Sequence[Episode], max_length: int) -> tuple[Margins, list[dict]]:
    from raypipe.stoprag.qnet import QNetwork, load_tokenizer, score

    net, _ = QNetwork.load(folder)
    texts = [t for ep in episodes for t in ep.texts]
    q_stop, q_cont = score(net, load_tokenizer(folder), texts, max_length)
    margins: Margins = {}
    rows, k = [], 0
    for ep in episodes:
        for it, reward in zip(ep.iterations, ep.rewards):
            margins.setdefault(ep.qid, {})[it] = q_stop[k] - q_cont[k]
            rows.append({"qid": ep.qid, "iteration": it, "reward": reward, "q_stop": q_stop[k], "q_cont": q_cont[k]})
            k += 1
    return margins, rows


def train_variant(
    cfg: StopRagConfig, config: RunConfig, episodes: dict[str, Episode], splits: Splits, out: Path, val_t: list[Trajectory]
) -> tuple[Path, float, Summary, list[dict], list[dict], Margins]:
    """Train one network, score val+test states, tune the threshold; store it in the network's metadata."""
    from raypipe.core.models import resolve_sentence_model
    from raypipe.stoprag.train import train_qnetwork

    texts, samples = training_samples([episodes[q] for q in sorted(splits.train) if q in episodes], cfg.drop_no_signal)
    log.info("Stop-RAG[%s]: %d training states (%d in the state table)", cfg.target, len(samples), len(texts))
    meta = {"state_input": cfg.state_input, "doc_chars": cfg.doc_chars, "first_decision": cfg.first_decision,
            "target": cfg.target, "encoder": cfg.encoder}  # fmt: skip
    dest = out / ("qnet" if cfg.target == config.stoprag.target else f"qnet_{cfg.target}")
    folder, history = train_qnetwork(
        texts, samples, cfg, resolve_sentence_model(cfg.encoder), dest, seed=config.seed, meta=meta, name=f"stoprag_{cfg.target}"
    )
    scored = [episodes[q] for q in sorted(splits.val | splits.test) if q in episodes]
    margins, margin_rows = score_episodes(folder, scored, cfg.max_length)
    threshold, val_summary = tune_threshold(val_t, margins, cfg.threshold_objective, cfg.min_share)
    meta_path = folder / "qnet.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "threshold": threshold}, indent=2))
    log.info("Stop-RAG[%s]: threshold %.4f on val: %.3f iterations, F1 %.3f (natural %.3f)", cfg.target, threshold,
             val_summary.mean_iterations, val_summary.mean_f1, val_summary.natural_f1)  # fmt: skip
    for row in margin_rows:
        row["target"] = cfg.target
    for row in history:
        row["target"] = cfg.target
    return folder, threshold, val_summary, history, margin_rows, margins


def default_engine(config: EngineConfig) -> Engine:
    from raypipe.llm.factory import build_engine

    return build_engine(config)


def llm_stop_margins(
    config: RunConfig,
    questions: dict[str, str],
    histories: dict[str, list[dict]],
    test_t: list[Trajectory],
    engine_factory: Callable[[EngineConfig], Engine] = default_engine,
) -> tuple[Margins, list[dict]]:
    """Run LLM-Stop through the engine on every decision point of the test trajectories (all at
    once, so the engine batches them); its verdicts become margins 1 (stop) / 0 (continue)."""
    from raypipe.stoprag.llm_stop import LLMStopController, judge_prefixes

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
            engine, max_tokens=cfg.llm_stop_max_tokens, temperature=cfg.llm_stop_temperature, docs=cfg.llm_stop_docs,
            doc_chars=cfg.doc_chars, default=cfg.llm_stop_default, first_decision=cfg.first_decision, seed=config.seed,
            enforce=cfg.llm_stop_enforce,
        )  # fmt: skip
        warmup = getattr(engine, "warmup", None)
        if cfg.llm_stop_enforce and warmup is not None:  # compile the grammar before the real requests
            asyncio.run(warmup([controller.regex]))
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
            rows.append({"qid": qid, "iteration": it, "verdict": parsed.verdict, "source": parsed.source, "output": raw})
    return margins, rows


def heuristic_controller(run: RunDir, config: RunConfig) -> tuple[OfflineController, set[str]] | None:
    """The 4-state heuristic at the online controller's thresholds (``stopping.theta_p/theta_u``, the
    paper's by default) over the run's predictions, and the questions they cover; None when the
    predictors have not run."""
    if not run.has("predictions"):
        return None
    from raypipe.stopping.grid import predictions_by_head
    from raypipe.stopping.heuristic import Thresholds, replay_controller

    heads = predictions_by_head(run.read("predictions"))
    if len(heads) != 1:
        raise ValueError(f"predictions/ holds {len(heads)} heads; expected the chosen one only")
    (preds,) = heads.values()
    return replay_controller(preds, Thresholds(config.stopping.theta_p, config.stopping.theta_u)), set(preds)


def comparison_rows(
    test_t: list[Trajectory], controllers: dict[str, tuple[OfflineController, str]], covered: dict[str, set[str]] | None = None
) -> tuple[list[dict], list[dict]]:
    """Summary rows and per-question outcomes; ``covered`` limits a controller to the questions it has
    inputs for (trajectories without retrieval need none)."""
    rows, outcomes = [], []
    for name, (controller, note) in controllers.items():
        qids = (covered or {}).get(name)
        outs = replay([t for t in test_t if qids is None or t.qid in qids or t.n_iterations == 0], controller)
        rows.append({**summarise(name, outs).row(), "note": note})
        outcomes.extend({**asdict(o), "controller": name} for o in outs)
    return rows, outcomes


def markdown(table: pd.DataFrame, title: str) -> str:
    lines = [f"{title.replace(chr(10), ' ')}\n", "| controller | questions | mean iterations | vs natural | mean F1 | share of natural F1 | tokens saved | note |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in table.itertuples(index=False):
        lines.append(
            f"| {r.controller} | {r.questions} | {r.mean_iterations:.3f} | {100 * r.iterations_change:+.1f}% | {r.mean_f1:.3f} "
            f"| {100 * r.f1_share:.1f}% | {100 * r.tokens_saved:+.1f}% | {r.note} |"
        )
    return "\n".join(lines) + "\n"


def plot(table: pd.DataFrame, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    caps = table[table["controller"].str.startswith("cap@")]
    ax.plot(caps["mean_iterations"], caps["mean_f1"], "s--", c="tab:blue", ms=5, label="Cap@k")
    for r in caps.itertuples():
        ax.annotate(r.controller.removeprefix("cap@"), (r.mean_iterations, r.mean_f1), fontsize=7, xytext=(3, 3), textcoords="offset points")
    others = table[~table["controller"].str.startswith("cap@")]
    markers = "*oD^v<>Ph"
    for i, r in enumerate(others.itertuples()):  # shrinking sizes keep coinciding points visible
        ax.scatter(r.mean_iterations, r.mean_f1, marker=markers[i % len(markers)], s=max(30, 260 - 45 * i), zorder=5 + i,
                   edgecolors="k", linewidths=0.5, label=f"{r.controller} (n={r.questions})")
    ax.set_xlabel("mean retrieval iterations (cost counted to the decision)")
    ax.set_ylabel("mean F1")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class StopRagReport:
    table: pd.DataFrame
    out: Path
    splits: dict[str, int]
    excluded: dict[str, int]
    seconds: float


def run_stoprag(
    run: RunDir,
    config: RunConfig,
    *,
    llm_stop: bool | None = None,
    ablation: Sequence[str] = (),
    engine_factory: Callable[[EngineConfig], Engine] = default_engine,
) -> StopRagReport:
    """The whole stage (Ray initialised by the caller). ``ablation``: more target types to train;
    ``llm_stop`` overrides ``stoprag.llm_stop``; ``engine_factory`` builds LLM-Stop's engine."""
    started = time.monotonic()
    cfg = config.stoprag
    out = run.path / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    trajectories, excluded = load_trajectories(run)
    splits = split_three([t.qid for t in trajectories], cfg.split, cfg.split_seed)
    if not splits.train or not splits.val or not splits.test:
        raise ValueError(f"{len(trajectories)} questions are too few for a train/val/test split {cfg.split}")
    log.info("%d questions: %d train, %d val, %d test", len(trajectories), len(splits.train), len(splits.val), len(splits.test))
    questions, histories = load_histories(run, config, {t.qid for t in trajectories})
    episodes = {
        qid: build_episode(qid, questions[qid], rows, first_decision=cfg.first_decision, mode=cfg.state_input, doc_chars=cfg.doc_chars)
        for qid, rows in histories.items()
    }
    val_t = [t for t in trajectories if t.qid in splits.val]
    test_t = [t for t in trajectories if t.qid in splits.test]

    controllers: dict[str, tuple[OfflineController, str]] = {"natural": (natural, "")}
    for k in range(1, max(t.n_iterations for t in test_t) + 1):
        controllers[f"cap@{k}"] = (cap(k), "")
    covered: dict[str, set[str]] = {}
    heuristic = heuristic_controller(run, config)
    if heuristic is not None:
        th = config.stopping
        controllers["heuristic"] = (heuristic[0], f"4-state, θ_P={th.theta_p}, θ_U={th.theta_u}")
        covered["heuristic"] = heuristic[1]
    histories_out, margin_rows = [], []
    for target in [cfg.target, *[a for a in ablation if a != cfg.target]]:
        variant = cfg.model_copy(update={"target": target})
        _, threshold, val_s, history, m_rows, margins = train_variant(variant, config, episodes, splits, out, val_t)
        name = "stoprag" if target == cfg.target else f"stoprag[{target}]"
        note = f"target {target}, threshold {threshold:.3f} (val: {val_s.mean_iterations:.2f} it, {100 * val_s.f1_share:.1f}% F1)"
        controllers[name] = (margin_controller(margins, threshold), note)
        histories_out += history
        margin_rows += m_rows
    pd.DataFrame(histories_out).to_csv(out / "training.csv", index=False)
    pd.DataFrame(margin_rows).to_parquet(out / "margins.parquet")

    rows, outcomes = comparison_rows(test_t, controllers, covered)
    if cfg.llm_stop if llm_stop is None else llm_stop:
        subset = test_t[: cfg.llm_stop_max_questions]
        margins, llm_rows = llm_stop_margins(config, questions, histories, subset, engine_factory)
        pd.DataFrame(llm_rows).to_parquet(out / "llm_stop.parquet")
        sources = pd.Series([r["source"] for r in llm_rows]).value_counts().to_dict() if llm_rows else {}
        note = f"{config.engine.model}{', enforced' if cfg.llm_stop_enforce else ''}; parsed by: " + ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
        more, more_out = comparison_rows(subset, {"llm_stop": (margin_controller(margins, 0.5, "llm_stop"), note)})
        if len(subset) < len(test_t):
            nat, _ = comparison_rows(subset, {"natural (LLM-Stop questions)": (natural, "")})
            more = nat + more
        rows += more
        outcomes += more_out
    table = pd.DataFrame(rows)
    table.to_csv(out / "comparison.csv", index=False)
    title = f"Stopping controllers on {len(test_t)} held-out test questions\n(Stop-RAG threshold tuned on {len(splits.val)} validation questions)"
    (out / "comparison.md").write_text(markdown(table, title))
    plot(table, out / "comparison.png", title)
    pd.DataFrame(outcomes).to_parquet(out / "outcomes.parquet")
    return StopRagReport(table, out, {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
                         excluded, time.monotonic() - started)  # fmt: skip


DESCRIPTION = """Train and evaluate Stop-RAG (Q(lambda) value-based stopping) and the LLM-Stop baseline on a run: RUN_DIR/stoprag/.

Trains the Q-network with Ray Train on the run's training questions, tunes its margin threshold on the
validation questions, and compares natural stopping, Cap@k, the 4-state heuristic (when predictions/
exists), Stop-RAG and LLM-Stop (the engine asked to STOP or CONTINUE) on the test questions:
RUN_DIR/stoprag/comparison.csv, .md and .png. Options are the ``stoprag`` section of the config
(``--set stoprag.target=mc``, ``--set stoprag.epochs=5``). The run's own config.yaml is the base
configuration unless --config names another.
"""




def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by jobs/probe.py")
    parser.add_argument("--no-llm-stop", action="store_true", help="skip the LLM-Stop baseline (it runs the engine)")
    parser.add_argument("--ablation", nargs="*", default=[], choices=["qlambda", "mc", "q0", "binary"],
                        help="also train these target types (the paper's ablation) and add them to the comparison")
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    if not run.path.is_dir():
        sys.exit(f"error: run directory {run.path} does not exist")
    config = run_config_from_args(args, run.path)

    import ray

    from raypipe.stages.stoprag import run_stoprag

    init_ray(config, log_to_driver=True)
    try:
        report = run_stoprag(run, config, llm_stop=False if args.no_llm_stop else None, ablation=args.ablation)
    except (RunDirError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    finally:
        ray.shutdown()
    run.write_config(config, "stoprag")
    log.info("questions %s, left out %s, %.0f s; wrote %s", report.splits, report.excluded or "none", report.seconds, report.out)
    print((report.out / "comparison.md").read_text())
