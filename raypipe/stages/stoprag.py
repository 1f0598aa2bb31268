"""The Stop-RAG stage (jobs/stoprag.py): train the Q-network, tune its threshold, compare controllers.

Reads ``iterations/`` and ``trajectories/`` (and ``predictions/`` for the 4-state heuristic, when the
predictors have run) and writes ``RUN_DIR/stoprag/``:

- ``qnet/``: the trained network with its tuned threshold (loadable by :class:`StopRagController`);
  ``qnet_<target>/`` for ablation targets (Ray Train's checkpoints live in ``ray_train/`` while it runs);
- ``comparison.csv``/``.md``/``.png``: natural, Cap@k, the heuristic, Stop-RAG (and its target
  ablations) and LLM-Stop on the test questions: mean iterations, F1, share of natural F1, tokens, and each
  controller's paired tests against natural stopping; ``significance.csv``/``.md``: those tests in full
  (:mod:`raypipe.analysis.policy_tests`);
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

Everything else is the Ray-free domain :func:`run_stoprag` calls: :mod:`raypipe.stoprag.splits`,
:mod:`raypipe.stoprag.episodes` (states and their rewards), :mod:`raypipe.stoprag.networks` (a network per
target and its threshold, trained by :func:`train_qnetwork`), :mod:`raypipe.stoprag.comparison` and
:mod:`raypipe.stoprag.llm_stop_baseline`. The engine those call (LLM-Stop, ``stoprag.reward_source=generator``)
runs in a Ray actor placed like the probe job's generation actors (``generation.actor_num_cpus`` /
``actor_num_gpus`` / ``resources``; :mod:`raypipe.runtime.engine_actor`), not in the driver, which on a
cluster runs on the GPU-less head.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from raypipe.analysis.policy_tests import STOPRAG_SIGNIFICANCE, stoprag_pvalues
from raypipe.analysis.tracking import Headline
from raypipe.core.config import EngineConfig, RunConfig, StopRagConfig
from raypipe.core.rundir import RunDir
from raypipe.core.train_run import StackedRun
from raypipe.llm.base import Engine
from raypipe.runtime.engine_actor import actor_engine_factory
from raypipe.runtime.stage_main import RunDirStage, StageRun, print_model_note
from raypipe.runtime.trainer import clear_storage, run_training, storage_location, torch_trainer
from raypipe.stopping.replay import load_trajectories
from raypipe.stoprag.comparison import baseline_controllers, comparison_rows, write_comparison
from raypipe.stoprag.episodes import build_episodes, load_histories, state_rewards
from raypipe.stoprag.llm_stop_baseline import llm_stop_comparison
from raypipe.stoprag.networks import stoprag_controllers
from raypipe.stoprag.rewards import rescore
from raypipe.stoprag.splits import split_three, split_train_run
from raypipe.stoprag.targets import Sample
from raypipe.stoprag.train import HISTORY, NETWORK_DIR, QNetTraining, loop_config

log = logging.getLogger(__name__)

OUT_DIR = "stoprag"


def train_loop(config: dict[str, Any]) -> None:
    """The Ray Train worker loop: the Q-network of ``config`` (:func:`raypipe.stoprag.train.loop_config`),
    its epochs and checkpoints those of :class:`~raypipe.stoprag.train.QNetTraining`."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    run_training(partial(QNetTraining, config), seed=config["seed"], threads=config["threads"])


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
    storage: str | None = None,
) -> tuple[Path, list[dict]]:
    """Train on Ray Train (``ray.init`` already done) and copy the final network to the folder ``dest``.

    Returns ``dest`` and the per-epoch metrics. Ray Train's own run folder (checkpoints) is ``<storage>/<name>``
    (``storage``: a path or URI, :func:`storage_location`; None: ``ray_train`` beside ``dest``) while training;
    the network is read back from its last checkpoint there, and the run folder is removed once it is copied out.
    """
    if not samples:
        raise ValueError("no training states: every training trajectory has a single state or no reward signal")
    if cfg.max_length is None:  # the longest input the encoder accepts
        from raypipe.stoprag.qnet import encoder_max_length

        cfg = cfg.model_copy(update={"max_length": encoder_max_length(encoder_path)})
    target = Path(dest).resolve()
    storage = storage or str(target.parent / "ray_train")
    clear_storage(f"{storage}/{name}")  # a rerun trains afresh, never on an old run's state
    trainer = torch_trainer(
        train_loop,
        loop_config(texts, samples, cfg, encoder_path, seed, meta or {}),
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
        shutil.copytree(Path(folder) / NETWORK_DIR, target)
        history = json.loads((Path(folder) / HISTORY).read_text())
    clear_storage(f"{storage}/{name}")  # checkpoints (network + optimizer state) served their purpose
    return target, history


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
    engine_factory: Callable[[EngineConfig], Engine] | None = None,
    train_run: RunDir | None = None,
) -> StopRagReport:
    """The whole stage (Ray initialised by the caller). ``ablation``: more target types to train;
    ``llm_stop`` overrides ``stoprag.llm_stop``; ``engine_factory`` (default :func:`build_engine`) builds the
    engine of LLM-Stop and of ``stoprag.reward_source=generator``, each time in an actor placed like a
    generation actor (:func:`actor_engine_factory`), never in the driver;
    ``train_run``: train and tune on that run's questions, test on every question of ``run``
    (:func:`split_train_run`); None: ``run`` split three ways (:func:`split_three`)."""
    started = time.monotonic()
    cfg = config.stoprag
    engines = actor_engine_factory(config.generation, engine_factory)
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
    log.info(
        "%d questions: %d train, %d val, %d test; %s",
        len(trajectories),
        len(splits.train),
        len(splits.val),
        len(splits.test),
        protocol,
    )
    questions, histories = load_histories(source, config, {t.qid for t in trajectories})
    scores, answers_note = state_rewards(source, config, questions, histories, engines, out)
    trajectories = [rescore(t, scores[t.qid]) for t in trajectories]  # one generator scores every controller
    episodes = build_episodes(config, questions, histories, {qid: s.f1 for qid, s in scores.items()})
    val_t = [t for t in trajectories if t.qid in splits.val]
    test_t = [t for t in trajectories if t.qid in splits.test]

    controllers, covered = baseline_controllers(run, config, test_t)
    storage = storage_location(config.ray.storage_path, run.path, f"{OUT_DIR}/ray_train")
    trainer = partial(train_qnetwork, storage=storage)
    controllers.update(stoprag_controllers(config, episodes, splits, val_t, out, ablation, trainer))
    rows, outcomes = comparison_rows(test_t, controllers, covered)
    if cfg.llm_stop if llm_stop is None else llm_stop:
        more, more_out = llm_stop_comparison(config, questions, histories, test_t, engines, out)
        rows += more
        outcomes += more_out
    pvalues = stoprag_pvalues(out, rows, outcomes, config.report)
    table = write_comparison(out, rows, outcomes, len(test_t), len(splits.val), answers_note, protocol, pvalues)
    return StopRagReport(
        table,
        out,
        {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
        excluded,
        time.monotonic() - started,
    )


DESCRIPTION = """Train and evaluate Stop-RAG (Q(lambda) value-based stopping) and the LLM-Stop baseline on a run: RUN_DIR/stoprag/.

Trains the Q-network with Ray Train on the run's training questions, tunes its margin threshold on the
validation questions, and compares natural stopping, Cap@k, the 4-state heuristic (when predictions/
exists), Stop-RAG and LLM-Stop (the engine asked to STOP or CONTINUE) on the test questions:
RUN_DIR/stoprag/comparison.csv, .md and .png, with paired tests of every controller against natural
stopping per question (F1: t and Wilcoxon signed-rank; EM: McNemar exact; iterations, tokens: signed-rank,
exact or by seeded sign flips; Holm-corrected, --set report.correction=bh for Benjamini-Hochberg), in full in RUN_DIR/stoprag/significance.md/.csv. Options are the ``stoprag``
section of the config (``--set stoprag.target=mc``, ``--set stoprag.epochs=5``). The run's own config.yaml
is the base configuration unless --config names another; --set tracking.mlflow_uri=PATH_OR_URL logs to MLflow.
"""  # noqa: E501 - the --help text as printed; its first line is the job's summary in `raypipe`


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-llm-stop", action="store_true", help="skip the LLM-Stop baseline (it runs the engine)")
    parser.add_argument(
        "--ablation",
        nargs="*",
        default=[],
        choices=["qlambda", "mc", "q0", "binary"],
        help="also train these target types (the paper's ablation) and add them to the comparison",
    )


def _stoprag(stage: StageRun) -> StopRagReport:
    return run_stoprag(
        stage.run,
        stage.config,
        llm_stop=False if stage.args.no_llm_stop else None,
        ablation=stage.args.ablation,
        train_run=stage.train_run,
    )


def _headline(run: RunDir, report: StopRagReport) -> Headline:
    """Every controller's test figures; the comparison and the tests."""
    figures = {
        f"{r.controller}.{k}": float(getattr(r, k))
        for r in report.table.itertuples()
        for k in ("mean_f1", "f1_share", "mean_iterations", "iterations_change")
    }
    files = [report.out / f"{stem}.{x}" for stem in ("comparison", STOPRAG_SIGNIFICANCE) for x in ("md", "csv")]
    return Headline({**figures, "seconds": report.seconds}, [*files, report.out / "comparison.png"])


STAGE = RunDirStage(
    name="stoprag",
    description=DESCRIPTION,
    run_dir_help="a run directory written by jobs/probe.py",
    arguments=_arguments,
    train_run=True,
    log_to_driver=True,
    headline=_headline,
)


def main() -> None:
    stage, report = STAGE.main(_stoprag)
    log.info(
        "questions %s, left out %s, %.0f s; wrote %s",
        report.splits,
        report.excluded or "none",
        report.seconds,
        report.out,
    )
    print((report.out / "comparison.md").read_text())
    print_model_note(stage.run)
