"""What the sweep replays (step 1 of ``raypipe sweep``): the questions, their validation/test split, the heads.

:func:`load_inputs` reads a run directory (and a training run stacked before it, the paper's protocol):
trajectories with predictions, the chosen head and the heads to sweep (``prediction_grid``), the θ grids
and the head refits the runs' signals allow.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from raypipe.core.config import HeadRefit, StoppingConfig, TrainConfig
from raypipe.core.rundir import RunDir
from raypipe.predict.splits import check_disjoint
from raypipe.stopping.grid import HeadKey, head_name, predictions_by_head, threshold_grid
from raypipe.stopping.heuristic import Predictions
from raypipe.stopping.refit import head_frame, refit_columns, refit_label, resolve
from raypipe.stopping.replay import Trajectory, load_trajectories, split_qids

log = logging.getLogger(__name__)


@dataclass
class SweepInputs:
    """What the sweep replays: the questions kept, their validation/test split, the heads, the θ grids."""

    trajectories: list[Trajectory]
    excluded: dict[str, int]  # questions left out, by reason
    split_of: dict[str, str]  # qid -> "val" or "test"
    questions: dict[str, int]  # questions per split
    chosen_head: HeadKey
    heads: dict[HeadKey, Predictions]
    theta_p: list[float]
    theta_u: list[float]
    refits: list[HeadRefit]  # resolved, each with the signals it needs
    refit_frame: pd.DataFrame | None  # what the refits fit on
    train_qids: set[str] | None = None  # a training run's questions (the validation split); None: one run
    protocol: str = ""  # the protocol line of the tables

    @property
    def chosen(self) -> Predictions:
        return self.heads[self.chosen_head]


def check_inputs(run: RunDir) -> None:
    """Fail early (before Ray starts) when an input table is missing, naming the job that makes it."""
    for name in ("iterations", "trajectories", "predictions"):
        run.read(name, columns=["qid"])


def load_heads(run: RunDir, which: str) -> tuple[HeadKey, dict[HeadKey, Predictions]]:
    """The chosen head (``predictions``) and the heads to sweep (``which``: chosen, windows, all)."""
    chosen_all = predictions_by_head(run.read("predictions"))
    if len(chosen_all) != 1:
        raise ValueError(f"{run.path}/predictions holds {len(chosen_all)} heads, expected the one chosen")
    chosen = next(iter(chosen_all))
    heads = dict(chosen_all)
    if which != "chosen":
        if run.has("prediction_grid"):
            grid = predictions_by_head(run.read("prediction_grid"))
            heads.update({h: p for h, p in grid.items() if which == "all" or h[0] == chosen[0]})
        else:
            log.warning("no prediction_grid in %s: sweeping the chosen head only", run.path)
    return chosen, heads


def load_refits(
    runs: Sequence[RunDir],
    refits: Sequence[HeadRefit],
    train: TrainConfig | None,
    question_types: Mapping[str, str] | None = None,
) -> tuple[list[HeadRefit], pd.DataFrame | None]:
    """The head refits the runs (a training run first, then the run) can fit (resolved against ``train``)
    and the frame they fit on."""
    if not refits:
        return [], None
    if train is None or not all(r.has("features") for r in runs):
        log.warning("no %s: head refits skipped", "features table" if train is not None else "train config")
        return [], None
    frame = pd.concat([head_frame(r, question_types) for r in runs], ignore_index=True)
    usable = []
    for refit in (resolve(r, train) for r in refits):
        missing = [c for c in refit_columns(refit, train) if c not in frame.columns]
        if missing:
            log.warning("head refit %s skipped: the run has no signals %s", refit_label(refit), missing)
        else:
            usable.append(refit)
    return usable, frame


def load_runs(
    run: RunDir, train_run: RunDir | None, which: str
) -> tuple[list[Trajectory], dict[str, int], HeadKey, dict[HeadKey, Predictions], set[str] | None]:
    """Trajectories and heads of the run, with a training run's stacked before them (its questions
    returned as the last item, None without one); both runs must share the chosen head and no question."""
    trajectories, excluded = load_trajectories(run)
    chosen_head, heads = load_heads(run, which)
    if train_run is None:
        return trajectories, excluded, chosen_head, heads, None
    train_t, train_excluded = load_trajectories(train_run)
    check_disjoint(
        [t.qid for t in train_t],
        [t.qid for t in trajectories],
        f"the training run {train_run.path}",
        f"the run {run.path}",
    )
    train_chosen, train_heads = load_heads(train_run, which)
    if train_chosen != chosen_head:
        raise ValueError(
            f"the training run's chosen head {head_name(train_chosen)} is not this run's {head_name(chosen_head)}"
        )
    shared: dict[HeadKey, Predictions] = {h: {**train_heads[h], **heads[h]} for h in heads if h in train_heads}
    for reason, n in train_excluded.items():
        excluded[f"train_run_{reason}"] = n
    return [*train_t, *trajectories], excluded, chosen_head, shared, {t.qid for t in train_t}


def load_inputs(
    run: RunDir,
    cfg: StoppingConfig,
    train: TrainConfig | None,
    train_run: RunDir | None = None,
    question_types: Mapping[str, str] | None = None,
) -> SweepInputs:
    """Step 1: the trajectories with predictions, split by qid, the heads and the θ grids to sweep.

    Without a training run the run's questions are split into validation and test halves by qid hash;
    with one (``train_run``, the seed paper's protocol) its questions are the validation split, where
    thresholds are chosen, and every question of ``run`` is a test question.
    """
    trajectories, excluded, chosen_head, heads, train_qids = load_runs(run, train_run, cfg.heads)
    chosen = heads[chosen_head]
    keep: list[Trajectory] = [t for t in trajectories if t.n_iterations == 0 or t.qid in chosen]
    if len(keep) < len(trajectories):
        excluded["no_predictions"] = len(trajectories) - len(keep)
        log.warning("%d questions have no predictions and are left out", len(trajectories) - len(keep))
    if train_qids is None:
        val, test = split_qids([t.qid for t in keep], cfg.val_fraction, cfg.split_seed)
    else:
        val = {t.qid for t in keep if t.qid in train_qids}
        test = {t.qid for t in keep if t.qid not in train_qids}
    if not val or not test:
        raise ValueError(f"{len(keep)} questions are too few for a validation/test split")
    val_preds = [pu for q in val for pu in chosen.get(q, {}).values()]
    theta_p = threshold_grid(cfg.theta_p_grid, [p for p, _ in val_preds], cfg.quantile_points)
    theta_u = threshold_grid(cfg.theta_u_grid, [u for _, u in val_preds if u is not None], cfg.quantile_points)
    log.info(
        "%d questions (%d val, %d test), %d heads (+%d refits) x %d variants x %d θ_P x %d θ_U",
        len(keep),
        len(val),
        len(test),
        len(heads),
        len(cfg.refits),
        len(cfg.variants),
        len(theta_p),
        len(theta_u),
    )
    runs = [run] if train_run is None else [train_run, run]
    refits, refit_frame = load_refits(runs, cfg.refits, train, question_types)
    if train_run is None:
        protocol = (
            "protocol: cross-fitting within this run (validation/test halves by qid hash, "
            f"{cfg.val_fraction:g} validation)"
        )
    else:
        protocol = f"protocol: thresholds chosen on the training run {train_run.path}, reported on this run's questions"
    return SweepInputs(
        trajectories=keep,
        excluded=excluded,
        split_of={**dict.fromkeys(val, "val"), **dict.fromkeys(test, "test")},
        questions={"val": len(val), "test": len(test)},
        chosen_head=chosen_head,
        heads=heads,
        theta_p=theta_p,
        theta_u=theta_u,
        refits=refits,
        refit_frame=refit_frame,
        train_qids=train_qids,
        protocol=protocol,
    )
