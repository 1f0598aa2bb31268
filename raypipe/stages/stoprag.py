"""The Stop-RAG stage (jobs/stoprag.py): train the Q-network, tune its threshold, compare controllers.

Reads ``iterations/`` and ``trajectories/`` (and ``predictions/`` for the 4-state heuristic, when the
predictors have run) and writes ``RUN_DIR/stoprag/``:

- ``qnet/``: the trained network with its tuned threshold (loadable by :class:`StopRagController`);
  ``qnet_<target>/`` for ablation targets (Ray Train's checkpoints live in ``ray_train/`` while it runs);
- ``comparison.csv``/``.md``/``.png``: natural, Cap@k, the heuristic, Stop-RAG (and its target
  ablations) and LLM-Stop on the test questions: mean iterations, F1, share of natural F1, tokens;
- ``outcomes.parquet``: every controller's decision per test question; ``margins.parquet``: Q_stop,
  Q_cont and the reward of every scored state; ``llm_stop.parquet``: LLM-Stop's raw outputs;
  ``rewards.parquet``: the generator's answers (``stoprag.reward_source=generator``);
- ``training.csv``: per-epoch loss and lambda of each trained network.

Questions are split by qid hash into train/val/test (``stoprag.split``); the threshold is tuned on val.
With ``--train-run TRAIN_RUN_DIR`` (the paper's protocol) that run's questions are split into train/val
and every question of RUN_DIR is a test question.
The Q-network trains on Ray Train (:func:`train_loop`, the steps of :mod:`raypipe.stoprag.train`): every
epoch rank 0 reports a checkpoint (network + optimizer state); after a worker failure Ray Train restarts
the workers and the loop resumes from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from raypipe.core.config import EngineConfig, RunConfig, StopRagConfig
from raypipe.core.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.core.tables import markdown_table
from raypipe.core.train_run import StackedRun, add_train_run_argument, resolve_train_run
from raypipe.llm.base import Engine
from raypipe.llm.factory import build_engine
from raypipe.predict.splits import check_disjoint
from raypipe.runtime.cluster import init_ray
from raypipe.runtime.trainer import torch_trainer
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
from raypipe.stopping.tradeoff import plot_caps, save_tradeoff
from raypipe.stoprag.rewards import rescore
from raypipe.stoprag.targets import (
    Episode,
    Margins,
    Sample,
    build_episode,
    cosine_lambda,
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


def split_train_run(
    train_t: Sequence[Trajectory], target_t: Sequence[Trajectory], shares: tuple[float, float, float], seed: int
) -> Splits:
    """train/val from the training run's questions (in the ratio of the first two ``shares``, by qid hash),
    test = every question of the target run; a question in both runs is an error."""
    train_qids, target_qids = [t.qid for t in train_t], [t.qid for t in target_t]
    check_disjoint(train_qids, target_qids)
    val, train = split_qids(train_qids, shares[1] / (shares[0] + shares[1]), seed)
    return Splits(train, val, set(target_qids))


def load_histories(run: RunDir, config: RunConfig, qids: set[str]) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Questions and per-qid iteration rows with their visible documents' titles and texts."""
    from raypipe.agents import visible_docs
    from raypipe.retrieval.build import corpus_path
    from raypipe.retrieval.store import corpus_documents

    top_k = visible_docs(config)  # what the agent saw; a state selects its documents among them
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
    from raypipe.stoprag.targets import SEP

    return load_tokenizer(resolve_sentence_model(cfg.encoder)).sep_token or SEP


def build_episodes(
    config: RunConfig, questions: dict[str, str], histories: dict[str, list[dict]], rewards: dict[str, dict[int, float]]
) -> dict[str, Episode]:
    """Every question's episode: its states as the Q-network reads them and their rewards."""
    cfg = config.stoprag
    sep = state_separator(cfg)
    return {
        qid: build_episode(qid, questions[qid], rows, first_decision=cfg.first_decision, mode=cfg.state_input,
                           doc_chars=cfg.doc_chars, per_round=cfg.docs_per_iteration, sep=sep, rewards=rewards[qid])
        for qid, rows in histories.items()
    }  # fmt: skip


def state_rewards(
    run: RunDir,
    config: RunConfig,
    questions: dict[str, str],
    histories: dict[str, list[dict]],
    engine_factory: Callable[[EngineConfig], Engine],
    out: Path,
) -> tuple[dict[str, dict[int, float]], str]:
    """qid -> iteration -> reward for every state (:mod:`raypipe.stoprag.rewards`), and the note that names
    the generator. The generator's answers go to ``rewards.parquet``."""
    from raypipe.stoprag.rewards import generator_note, generator_rewards, state_documents
    from raypipe.stoprag.targets import probe_rewards

    cfg = config.stoprag
    if cfg.reward_source == "probe":
        if not any(r.get("probe_answer") is not None for rows in histories.values() for r in rows):
            raise ValueError("the run has no probed answers (agent.probe=false?): use stoprag.reward_source=generator")
        return {qid: probe_rewards(rows) for qid, rows in histories.items()}, generator_note(cfg, config.engine.model)
    golden = dict(zip(*run.read("trajectories", ["qid", "golden_answers"]).to_pydict().values()))
    states = {}
    for qid, rows in histories.items():
        rounds = rounds_from_history(rows)
        for it in range(len(rounds) + 1):
            states[(qid, it)] = (questions[qid], state_documents(rounds[:it], cfg.docs_per_iteration))
    log.info("rewards: %d states x %d answers from the docs-only final-answer prompt", len(states), cfg.reward_samples)
    engine = engine_factory(config.engine)
    try:
        started = time.perf_counter()
        totals, rows = asyncio.run(generator_rewards(engine, states, golden, cfg, config.agent.metric, config.seed))
        log.info("rewards: generated in %.1f s", time.perf_counter() - started)
    finally:
        asyncio.run(engine.close())
    pd.DataFrame(rows).to_parquet(out / "rewards.parquet")
    rewards: dict[str, dict[int, float]] = {}
    for (qid, it), value in totals.items():
        rewards.setdefault(qid, {})[it] = value
    return rewards, generator_note(cfg, config.engine.model)


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


TRAINER_STATE = "trainer_state.pt"
HISTORY = "history.json"  # per-epoch metrics, in every checkpoint
LOG_EVERY = 10  # optimizer steps between progress lines


def train_loop(config: dict[str, Any]) -> None:
    """The Ray Train worker loop: the steps of :mod:`raypipe.stoprag.train`, a checkpoint (network and
    optimizer state) every epoch; after a restart it resumes from the last one."""
    import ray.train
    import ray.train.torch
    import torch
    from transformers import get_cosine_schedule_with_warmup

    from raypipe.stoprag.qnet import QNetwork, load_tokenizer
    from raypipe.stoprag.train import batch_loss, cont_targets, worker_share

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    cfg = StopRagConfig.model_validate(config["stoprag"])
    texts: list[str] = config["texts"]
    samples = [Sample(**s) for s in config["samples"]]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
    torch.manual_seed(config["seed"])

    tokenizer = load_tokenizer(config["encoder_path"])
    net = QNetwork(config["encoder_path"], pooling=cfg.pooling, dropout=cfg.dropout)
    # some encoders carry parameters the heads never use (BERT's pooler): let DDP tolerate them
    model = ray.train.torch.prepare_model(net, parallel_strategy_kwargs={"find_unused_parameters": True})
    device = ray.train.torch.get_device()
    steps_per_epoch = max(1, math.ceil(len(samples) / (world * cfg.batch_size)))
    total_steps = steps_per_epoch * cfg.epochs
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total_steps), total_steps)
    start_epoch, step, history = 0, 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / TRAINER_STATE, map_location="cpu", weights_only=False)
            net.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            start_epoch, step, history = state["epoch"] + 1, state["step"], state["history"]
        log.info("resuming from epoch %d (step %d)", start_epoch, step)

    started, first_step = time.perf_counter(), step
    for epoch in range(start_epoch, cfg.epochs):
        mine = worker_share(len(samples), config["seed"], epoch, rank, world, steps_per_epoch * cfg.batch_size)
        total_loss = 0.0
        for b in range(steps_per_epoch):
            batch = [samples[i] for i in mine[b * cfg.batch_size : (b + 1) * cfg.batch_size]]
            lam = cosine_lambda(step, total_steps, cfg.lambda_start, cfg.lambda_end)
            targets = cont_targets(net, tokenizer, texts, batch, cfg, lam)
            loss = batch_loss(model, tokenizer, texts, batch, targets, cfg, device)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            total_loss += loss.item()
            if rank == 0 and (step % LOG_EVERY == 0 or step == total_steps):
                rate = (step - first_step) / (time.perf_counter() - started)
                log.info("step %d/%d  loss %.4f  lambda %.3f  %.2f steps/s", step, total_steps, loss.item(), lam, rate)
        metrics = {"epoch": epoch, "step": step, "loss": total_loss / steps_per_epoch,
                   "lambda": cosine_lambda(step, total_steps, cfg.lambda_start, cfg.lambda_end)}
        history.append(metrics)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                net.save(Path(tmp) / "qnet", tokenizer, extra=config["meta"])
                state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "epoch": epoch, "step": step, "history": history}
                torch.save(state, Path(tmp) / TRAINER_STATE)
                (Path(tmp) / HISTORY).write_text(json.dumps(history))
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=ckpt)


def train_qnetwork(
    texts: list[str],
    samples: list[Sample],
    cfg: StopRagConfig,
    encoder_path: str | Path,
    dest: str | Path,
    *,
    seed: int = 0,
    meta: dict | None = None,
    name: str = "stoprag",
) -> tuple[Path, list[dict]]:
    """Train on Ray Train (``ray.init`` already done) and copy the final network to the folder ``dest``.

    Returns ``dest`` and the per-epoch metrics. Ray Train's own run folder (checkpoints) is
    ``ray_train/<name>`` beside ``dest`` while training; it is removed once the network is copied out.
    """
    if not samples:
        raise ValueError("no training states: every training trajectory has a single state or no reward signal")
    if cfg.max_length is None:  # the longest input the encoder accepts
        from raypipe.stoprag.qnet import encoder_max_length

        cfg = cfg.model_copy(update={"max_length": encoder_max_length(encoder_path)})
    target = Path(dest).resolve()
    storage = target.parent / "ray_train"
    shutil.rmtree(storage / name, ignore_errors=True)  # a rerun trains afresh, never on an old run's state
    trainer = torch_trainer(
        train_loop,
        {
            "stoprag": cfg.model_dump(mode="json"),
            "texts": texts,
            "samples": [asdict(s) for s in samples],
            "encoder_path": str(encoder_path),
            "seed": seed,
            "meta": {"max_length": cfg.max_length, **(meta or {})},
        },
        name=name,
        storage=storage,
        num_workers=cfg.num_workers,
        use_gpu=cfg.use_gpu,
        cpus_per_worker=cfg.cpus_per_worker,
        keep=1,
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"Ray Train finished without a checkpoint: {result.error}")
    with result.checkpoint.as_directory() as folder:
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(Path(folder) / "qnet", target)
        history = json.loads((Path(folder) / HISTORY).read_text())
    shutil.rmtree(storage / name, ignore_errors=True)  # checkpoints (network + optimizer state) served their purpose
    return target, history


def train_variant(
    cfg: StopRagConfig, config: RunConfig, episodes: dict[str, Episode], splits: Splits, out: Path, val_t: list[Trajectory]
) -> tuple[Path, float, Summary, list[dict], list[dict], Margins]:
    """Train one network, score val+test states, tune the threshold; store it in the network's metadata."""
    from raypipe.core.models import resolve_sentence_model

    texts, samples = training_samples([episodes[q] for q in sorted(splits.train) if q in episodes], cfg.drop_no_signal)
    log.info("Stop-RAG[%s]: %d training states (%d in the state table)", cfg.target, len(samples), len(texts))
    meta = {"state_input": cfg.state_input, "doc_chars": cfg.doc_chars, "docs_per_iteration": cfg.docs_per_iteration,
            "state_truncation": cfg.state_truncation, "first_decision": cfg.first_decision, "target": cfg.target,
            "encoder": cfg.encoder, "reward_source": cfg.reward_source}  # fmt: skip
    dest = out / ("qnet" if cfg.target == config.stoprag.target else f"qnet_{cfg.target}")
    folder, history = train_qnetwork(
        texts, samples, cfg, resolve_sentence_model(cfg.encoder), dest, seed=config.seed, meta=meta, name=f"stoprag_{cfg.target}"
    )
    scored = [episodes[q] for q in sorted(splits.val | splits.test) if q in episodes]
    margins, margin_rows = score_episodes(folder, scored)
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


def llm_stop_margins(
    config: RunConfig,
    questions: dict[str, str],
    histories: dict[str, list[dict]],
    test_t: list[Trajectory],
    engine_factory: Callable[[EngineConfig], Engine] = build_engine,
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
            enforce=cfg.llm_stop_enforce, parser=cfg.llm_stop_parser,
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
    columns = ["controller", "questions", "mean iterations", "vs natural", "mean F1", "share of natural F1",
               "tokens saved", "note"]  # fmt: skip
    rows = [
        (r.controller, r.questions, f"{r.mean_iterations:.3f}", f"{100 * r.iterations_change:+.1f}%", f"{r.mean_f1:.3f}",
         f"{100 * r.f1_share:.1f}%", f"{100 * r.tokens_saved:+.1f}%", r.note)
        for r in table.itertuples(index=False)
    ]  # fmt: skip
    return f"{title.replace(chr(10), ' ')}\n\n{markdown_table(columns, rows)}\n"


def plot(table: pd.DataFrame, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_caps(ax, table)
    others = table[~table["controller"].str.startswith("cap@")]
    markers = "*oD^v<>Ph"
    for i, r in enumerate(others.itertuples()):  # shrinking sizes keep coinciding points visible
        ax.scatter(r.mean_iterations, r.mean_f1, marker=markers[i % len(markers)], s=max(30, 260 - 45 * i), zorder=5 + i,
                   edgecolors="k", linewidths=0.5, label=f"{r.controller} (n={r.questions})")
    return save_tradeoff(fig, ax, path, title, legend_loc="best")


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
    engine_factory: Callable[[EngineConfig], Engine] = build_engine,
    train_run: RunDir | None = None,
) -> StopRagReport:
    """The whole stage (Ray initialised by the caller). ``ablation``: more target types to train;
    ``llm_stop`` overrides ``stoprag.llm_stop``; ``engine_factory`` builds LLM-Stop's engine;
    ``train_run``: train and tune on that run's questions, test on every question of ``run``
    (:func:`split_train_run`); None: ``run`` split three ways (:func:`split_three`)."""
    started = time.monotonic()
    cfg = config.stoprag
    out = run.path / OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    source = run if train_run is None else StackedRun(train_run, run)  # the training run's rows, then the run's
    trajectories, excluded = load_trajectories(source)
    if train_run is None:
        splits = split_three([t.qid for t in trajectories], cfg.split, cfg.split_seed)
        protocol = f"protocol: cross-fitting within this run (train/val/test {cfg.split} by qid hash)"
    else:
        splits = split_train_run(load_trajectories(train_run)[0], load_trajectories(run)[0], cfg.split, cfg.split_seed)
        protocol = f"protocol: trained and tuned on the training run {train_run.path}, tested on this run's questions"
    if not splits.train or not splits.val or not splits.test:
        raise ValueError(f"{len(trajectories)} questions are too few for a train/val/test split {cfg.split}")
    log.info("%d questions: %d train, %d val, %d test; %s", len(trajectories), len(splits.train), len(splits.val),
             len(splits.test), protocol)  # fmt: skip
    questions, histories = load_histories(source, config, {t.qid for t in trajectories})
    rewards, answers_note = state_rewards(source, config, questions, histories, engine_factory, out)
    trajectories = [rescore(t, rewards[t.qid]) for t in trajectories]  # one generator scores every controller
    episodes = build_episodes(config, questions, histories, rewards)
    val_t = [t for t in trajectories if t.qid in splits.val]
    test_t = [t for t in trajectories if t.qid in splits.test]

    controllers, covered = baseline_controllers(run, config, test_t)
    controllers.update(stoprag_controllers(config, episodes, splits, val_t, out, ablation))
    rows, outcomes = comparison_rows(test_t, controllers, covered)
    if cfg.llm_stop if llm_stop is None else llm_stop:
        more, more_out = llm_stop_comparison(config, questions, histories, test_t, engine_factory, out)
        rows += more
        outcomes += more_out
    table = write_comparison(out, rows, outcomes, len(test_t), len(splits.val), answers_note, protocol)
    return StopRagReport(table, out, {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
                         excluded, time.monotonic() - started)  # fmt: skip


def baseline_controllers(
    run: RunDir, config: RunConfig, test_t: list[Trajectory]
) -> tuple[dict[str, tuple[OfflineController, str]], dict[str, set[str]]]:
    """Natural stopping, Cap@k up to the longest test trajectory and, when predictions/ exists, the
    4-state heuristic; with the questions the heuristic covers."""
    controllers: dict[str, tuple[OfflineController, str]] = {"natural": (natural, "")}
    for k in range(1, max(t.n_iterations for t in test_t) + 1):
        controllers[f"cap@{k}"] = (cap(k), "")
    covered: dict[str, set[str]] = {}
    heuristic = heuristic_controller(run, config)
    if heuristic is not None:
        th = config.stopping
        controllers["heuristic"] = (heuristic[0], f"4-state, θ_P={th.theta_p}, θ_U={th.theta_u}")
        covered["heuristic"] = heuristic[1]
    return controllers, covered


def stoprag_controllers(
    config: RunConfig, episodes: dict[str, Episode], splits: Splits, val_t: list[Trajectory], out: Path,
    ablation: Sequence[str],
) -> dict[str, tuple[OfflineController, str]]:
    """A network for the configured target and each ablation target, as margin controllers at their tuned
    thresholds; their training curves go to training.csv, their scored states to margins.parquet."""
    cfg = config.stoprag
    controllers, histories_out, margin_rows = {}, [], []
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
    return controllers


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
    note = f"{config.engine.model}{', enforced' if cfg.llm_stop_enforce else ''}; parsed by: " + ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
    rows, outcomes = comparison_rows(subset, {"llm_stop": (margin_controller(margins, 0.5, "llm_stop"), note)})
    if len(subset) < len(test_t):
        nat, _ = comparison_rows(subset, {"natural (LLM-Stop questions)": (natural, "")})
        rows = nat + rows
    return rows, outcomes


def write_comparison(
    out: Path, rows: list[dict], outcomes: list[dict], n_test: int, n_val: int, answers_note: str, protocol: str = ""
) -> pd.DataFrame:
    """comparison.csv/.md/.png and outcomes.parquet; returns the comparison table. ``answers_note``
    names the answer generator that scored every controller (an ``answers`` column, a line of the .md);
    ``protocol`` the train/test protocol (a ``protocol`` column, a line of the .md)."""
    table = pd.DataFrame(rows)
    table.assign(answers=answers_note, protocol=protocol).to_csv(out / "comparison.csv", index=False)
    title = f"Stopping controllers on {n_test} held-out test questions\n(Stop-RAG threshold tuned on {n_val} validation questions)"
    more = f"\n{protocol}.\n" if protocol else ""
    (out / "comparison.md").write_text(markdown(table, title) + f"\nF1 of every controller: {answers_note}.\n" + more)
    plot(table, out / "comparison.png", title)
    pd.DataFrame(outcomes).to_parquet(out / "outcomes.parquet")
    return table


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
    add_train_run_argument(parser)
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    if not run.path.is_dir():
        sys.exit(f"error: run directory {run.path} does not exist")
    config = run_config_from_args(args, run.path)
    train_run = resolve_train_run(config, args.train_run, run)

    import ray

    init_ray(config, log_to_driver=True)
    try:
        report = run_stoprag(run, config, llm_stop=False if args.no_llm_stop else None, ablation=args.ablation,
                             train_run=train_run)  # fmt: skip
    except (RunDirError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    finally:
        ray.shutdown()
    run.write_config(config, "stoprag")
    log.info("questions %s, left out %s, %.0f s; wrote %s", report.splits, report.excluded or "none", report.seconds, report.out)
    print((report.out / "comparison.md").read_text())
