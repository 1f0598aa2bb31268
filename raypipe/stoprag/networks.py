"""Stop-RAG's networks as controllers: one Q-network per target type, its threshold tuned on validation.

The training itself (Ray Train in ``raypipe stoprag``) is passed in as a :class:`NetworkTrainer`, so this
module stays Ray-free: :func:`train_variant` trains one network, scores the validation and test states and
tunes its margin threshold; :func:`stoprag_controllers` does it for the configured target and each ablation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import pandas as pd

from raypipe.core.config import RunConfig, StopRagConfig
from raypipe.stopping.replay import OfflineController, Summary, Trajectory
from raypipe.stoprag.episodes import score_episodes
from raypipe.stoprag.splits import Splits
from raypipe.stoprag.targets import Episode, Margins, Sample, margin_controller, training_samples, tune_threshold

log = logging.getLogger(__name__)


class NetworkTrainer(Protocol):
    """Trains a Q-network on ``samples`` and saves it to the folder ``dest``; returns the folder and the
    per-epoch metrics (:func:`raypipe.stages.stoprag.train_qnetwork`)."""

    def __call__(
        self,
        texts: list[str],
        samples: list[Sample],
        cfg: StopRagConfig,
        encoder_path: str | Path,
        dest: str | Path,
        *,
        seed: int = 0,
        meta: dict | None = None,
        name: str = "stoprag",
    ) -> tuple[Path, list[dict]]: ...


def train_variant(
    cfg: StopRagConfig,
    config: RunConfig,
    episodes: dict[str, Episode],
    splits: Splits,
    out: Path,
    val_t: list[Trajectory],
    trainer: NetworkTrainer,
) -> tuple[Path, float, Summary, list[dict], list[dict], Margins]:
    """Train one network with ``trainer``, score val+test states, tune the threshold; store it in the
    network's metadata."""
    from raypipe.core.models import resolve_sentence_model

    texts, samples = training_samples([episodes[q] for q in sorted(splits.train) if q in episodes], cfg.drop_no_signal)
    log.info("Stop-RAG[%s]: %d training states (%d in the state table)", cfg.target, len(samples), len(texts))
    meta = {
        "state_input": cfg.state_input,
        "doc_chars": cfg.doc_chars,
        "docs_per_iteration": cfg.docs_per_iteration,
        "state_truncation": cfg.state_truncation,
        "first_decision": cfg.first_decision,
        "target": cfg.target,
        "encoder": cfg.encoder,
        "reward_source": cfg.reward_source,
    }
    dest = out / ("qnet" if cfg.target == config.stoprag.target else f"qnet_{cfg.target}")
    folder, history = trainer(
        texts,
        samples,
        cfg,
        resolve_sentence_model(cfg.encoder),
        dest,
        seed=config.seed,
        meta=meta,
        name=f"stoprag_{cfg.target}",
    )
    scored = [episodes[q] for q in sorted(splits.val | splits.test) if q in episodes]
    margins, margin_rows = score_episodes(folder, scored)
    threshold, val_summary = tune_threshold(val_t, margins, cfg.threshold_objective, cfg.min_share)
    meta_path = folder / "qnet.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "threshold": threshold}, indent=2))
    log.info(
        "Stop-RAG[%s]: threshold %.4f on val: %.3f iterations, F1 %.3f (natural %.3f)",
        cfg.target,
        threshold,
        val_summary.mean_iterations,
        val_summary.mean_f1,
        val_summary.natural_f1,
    )
    for row in margin_rows:
        row["target"] = cfg.target
    for row in history:
        row["target"] = cfg.target
    return folder, threshold, val_summary, history, margin_rows, margins


def stoprag_controllers(
    config: RunConfig,
    episodes: dict[str, Episode],
    splits: Splits,
    val_t: list[Trajectory],
    out: Path,
    ablation: Sequence[str],
    trainer: NetworkTrainer,
) -> dict[str, tuple[OfflineController, str]]:
    """A network for the configured target and each ablation target (trained by ``trainer``), as margin
    controllers at their tuned thresholds; their training curves go to training.csv, their scored states to
    margins.parquet."""
    cfg = config.stoprag
    controllers, histories_out, margin_rows = {}, [], []
    for target in [cfg.target, *[a for a in ablation if a != cfg.target]]:
        variant = cfg.model_copy(update={"target": target})
        _, threshold, val_s, history, m_rows, margins = train_variant(
            variant, config, episodes, splits, out, val_t, trainer
        )
        name = "stoprag" if target == cfg.target else f"stoprag[{target}]"
        note = (
            f"target {target}, threshold {threshold:.3f} "
            f"(val: {val_s.mean_iterations:.2f} it, {100 * val_s.f1_share:.1f}% F1)"
        )
        controllers[name] = (margin_controller(margins, threshold), note)
        histories_out += history
        margin_rows += m_rows
    pd.DataFrame(histories_out).to_csv(out / "training.csv", index=False)
    pd.DataFrame(margin_rows).to_parquet(out / "margins.parquet")
    return controllers
