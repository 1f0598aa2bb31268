"""The sweep job (jobs/sweep.py): Tune sweep, selection on validation, test tables, Figure 5.

Reads ``iterations/``, ``trajectories/``, ``predictions/`` (and ``prediction_grid/`` for other heads)
and writes ``RUN_DIR/stopping/``: ``01_tradeoff.md``/``.csv`` (test questions: natural, Cap@k, the
heuristic at the paper's thresholds, validation-chosen operating points, with a summary against the
paper's operating point), ``02_figure5.png``, ``selected.json`` (the chosen configurations, loadable
by the online controller), ``data/`` (``grid.parquet``: every head × variant × θ pair's outcome sums
per split and dataset; ``selections.csv``: every validation choice scored on test; ``pareto.csv``)
and ``tune/`` (the Tune experiment; ``tensorboard --logdir RUN_DIR/stopping/tune``). The report job
shows the numbered files.

:func:`run_sweep` runs four steps: :func:`load_inputs`, :func:`sweep_grid`, :func:`choose` and
:func:`write_outputs`. The grid maths are :mod:`raypipe.stopping.grid`'s.

Ray Tune adapter (:func:`run_tune`): one trial per prediction head (feature group × window from the
predictors' ``prediction_grid``, or a head refit with other training settings), each replaying the
whole threshold grid for every variant (trial start-up dominates on small machines, so trials are few
and fat). A trial reports, per variant, the validation-chosen operating point with its validation and
test figures (browsable in TensorBoard under the Tune storage path) and checkpoints its full grid,
which the driver collects.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raypipe.core.config import PAPER_THETA_U_STRICT, HeadRefit, StoppingConfig, TrainConfig
from raypipe.core.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.core.train_run import add_train_run_argument, resolve_train_run
from raypipe.predict.qtypes import run_question_types
from raypipe.predict.splits import check_disjoint
from raypipe.runtime.cluster import init_ray
from raypipe.stopping.grid import (
    HeadKey,
    aggregate,
    baseline_rows,
    choose_thresholds,
    controller_rows,
    cross_fit,
    evaluate_grid,
    head_name,
    pareto_front,
    predictions_by_head,
    score_choice,
    threshold_grid,
)
from raypipe.stopping.heuristic import PAPER_THRESHOLDS, VARIANTS, Predictions, Thresholds, replay_controller
from raypipe.stopping.refit import head_frame, refit_columns, refit_label, refit_predictions, resolve
from raypipe.stopping.replay import Trajectory, load_trajectories, split_qids
from raypipe.stopping.tradeoff import figure5, markdown, summary, table_row, to_frame

log = logging.getLogger(__name__)
STOPPING_DIR = "stopping"
SELECTED = "selected.json"
TRADEOFF = "01_tradeoff"
FIGURE = "02_figure5.png"
DATA = "data"
# The paper's heuristic at fixed thresholds in the table: the paper's θ, and a stricter θ_U beside it.
FIXED_THRESHOLDS = (PAPER_THRESHOLDS, Thresholds(PAPER_THRESHOLDS.theta_p, PAPER_THETA_U_STRICT))


@dataclass
class SweepReport:
    table: pd.DataFrame  # the trade-off table (test questions)
    selected: dict  # what selected.json holds
    out_dir: Path
    excluded: dict[str, int]
    seconds: float


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


@dataclass
class Choices:
    """What the sweep chose on validation questions, scored on test."""

    table: pd.DataFrame  # the trade-off table shown
    rows: list[dict]  # baselines, fixed θ and every validation choice (selections.csv)
    base_test: pd.DataFrame  # natural stopping and Cap@k on test, one row per controller
    paper: dict  # the paper's heuristic at the paper's θ
    faithful: pd.Series  # the paper's heuristic on the chosen head, one θ chosen on validation
    best: pd.Series  # the best validation choice over heads × variants × selections
    thresholds: dict[tuple, dict[str, Thresholds]]  # (group, window, variant, selection) -> chosen θ


def check_inputs(run: RunDir) -> None:
    """Fail early (before Ray starts) when an input table is missing, naming the job that makes it."""
    for name in ("iterations", "trajectories", "predictions"):
        run.read(name, columns=["qid"])


def load_heads(run: RunDir, which: str) -> tuple[HeadKey, dict]:
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
    check_disjoint([t.qid for t in train_t], [t.qid for t in trajectories], f"the training run {train_run.path}",
                   f"the run {run.path}")  # fmt: skip
    train_chosen, train_heads = load_heads(train_run, which)
    if train_chosen != chosen_head:
        raise ValueError(f"the training run's chosen head {head_name(train_chosen)} is not this run's {head_name(chosen_head)}")
    shared = {h: {**train_heads[h], **heads[h]} for h in heads if h in train_heads}
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
    theta_u = threshold_grid(cfg.theta_u_grid, [u for _, u in val_preds], cfg.quantile_points)
    log.info(
        "%d questions (%d val, %d test), %d heads (+%d refits) x %d variants x %d θ_P x %d θ_U",
        len(keep), len(val), len(test), len(heads), len(cfg.refits), len(cfg.variants), len(theta_p), len(theta_u),
    )  # fmt: skip
    runs = [run] if train_run is None else [train_run, run]
    refits, refit_frame = load_refits(runs, cfg.refits, train, question_types)
    if train_run is None:
        protocol = f"protocol: cross-fitting within this run (validation/test halves by qid hash, {cfg.val_fraction:g} validation)"
    else:
        protocol = f"protocol: thresholds chosen on the training run {train_run.path}, reported on this run's questions"
    return SweepInputs(
        trajectories=keep,
        excluded=excluded,
        split_of={**{q: "val" for q in val}, **{q: "test" for q in test}},
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


def sweep_grid(
    inputs: SweepInputs, cfg: StoppingConfig, out: Path, experiment: str, train: TrainConfig | None, seed: int
) -> pd.DataFrame:
    """Step 2: every head's threshold grid as a Tune experiment under ``out/tune``, kept as data/grid.parquet."""
    grid = run_tune(
        inputs.trajectories, inputs.heads, inputs.split_of, variants=cfg.variants, theta_p=inputs.theta_p,
        theta_u=inputs.theta_u, min_f1_share=cfg.min_f1_share, storage_path=out / "tune", name=experiment,
        max_concurrent_trials=cfg.max_concurrent_trials, trial_num_cpus=cfg.trial_num_cpus,
        refits=inputs.refits, refit_frame=inputs.refit_frame, train=train, seed=seed, train_qids=inputs.train_qids,
    )  # fmt: skip
    grid.to_parquet(out / DATA / "grid.parquet")
    return grid


def _baseline_rows(inputs: SweepInputs) -> tuple[pd.DataFrame, list[dict]]:
    """Natural stopping and Cap@k: their test metrics (one row per controller) and their table rows."""
    base = pd.DataFrame(baseline_rows(inputs.trajectories, inputs.split_of))
    base_test = aggregate(base[base["split"] == "test"], ["controller"])
    base_val = aggregate(base[base["split"] == "val"], ["controller"]).set_index("controller")
    base_all = aggregate(base, ["controller"]).set_index("controller")
    rows = [
        table_row(
            r["controller"], r, base_val.loc[r["controller"]], base_all.loc[r["controller"]], selection="baseline"
        )
        for _, r in base_test.iterrows()
    ]
    return base_test, rows


def _fixed_rows(inputs: SweepInputs) -> list[dict]:
    """The paper's heuristic on the chosen head at :data:`FIXED_THRESHOLDS`, in that order."""
    group, window = inputs.chosen_head
    rows = []
    for th in FIXED_THRESHOLDS:
        controller = replay_controller(inputs.chosen, th)
        fixed = pd.DataFrame(controller_rows(inputs.trajectories, controller, inputs.split_of, controller="fixed"))
        test, val = (aggregate(fixed[fixed["split"] == s], ["controller"]).iloc[0] for s in ("test", "val"))
        every = aggregate(fixed, ["controller"]).iloc[0]
        rows.append(
            table_row(
                "heuristic[paper]", test, val, every, feature_group=group, window=window, variant="paper",
                theta_p=th.theta_p, theta_u=th.theta_u, selection="paper θ",
            )
        )  # fmt: skip
    return rows


def _selection_rows(grid: pd.DataFrame, min_share: float) -> tuple[list[dict], dict]:
    """Validation-chosen thresholds of every head × variant (global and per dataset), scored on test."""
    rows, choices = [], {}
    for (group, window, variant), part in grid.groupby(["feature_group", "window", "variant"], sort=False):
        for selection in ("global", "per_dataset"):
            per_dataset = selection == "per_dataset"
            chosen = choose_thresholds(part, min_share, per_dataset)
            val, test = score_choice(part, chosen, "val"), score_choice(part, chosen, "test")
            every = cross_fit(part, min_share, per_dataset)
            th = chosen["*"] if selection == "global" else None
            note = (
                ""
                if th
                else " ".join(f"{ds}:({t.theta_p:.3g},{t.theta_u:.3g})" for ds, t in chosen.items() if ds != "*")
            )
            rows.append(
                table_row(
                    f"heuristic[{variant}]", test, val, every, feature_group=group, window=int(window), variant=variant,
                    theta_p=th.theta_p if th else float("nan"), theta_u=th.theta_u if th else float("nan"),
                    selection=selection, note=note,
                )
            )  # fmt: skip
            choices[(group, int(window), variant, selection)] = chosen
    return rows, choices


def _tradeoff_table(
    rows: list[dict], faithful: pd.DataFrame, per_variant: pd.DataFrame, best: pd.Series
) -> pd.DataFrame:
    """The rows shown (baselines and fixed θ, the faithful choices, each variant's best), the best marked."""
    shown = pd.concat([to_frame(rows), faithful, per_variant])
    table = shown.drop_duplicates(subset=[c for c in shown.columns if c != "note"], keep="first").reset_index(drop=True)
    same = (
        table[["feature_group", "variant", "selection"]] == best[["feature_group", "variant", "selection"]].values
    ).all(axis=1)
    mark = same & (table["window"] == best["window"])
    table.loc[mark, "note"] = ("best on validation " + table.loc[mark, "note"].fillna("")).str.strip()
    return table


def choose(inputs: SweepInputs, grid: pd.DataFrame, min_share: float) -> Choices:
    """Step 3: thresholds chosen on validation for every head × variant, the best of them, the trade-off table.

    The best is the fewest validation iterations among the choices keeping ``min_share`` of natural F1
    on validation (the faithful heuristic's choices when none does).
    """
    base_test, rows = _baseline_rows(inputs)
    fixed = _fixed_rows(inputs)
    rows += fixed
    sel_rows, thresholds = _selection_rows(grid, min_share)
    sel = to_frame(sel_rows)
    group, window = inputs.chosen_head
    faithful = sel[(sel["feature_group"] == group) & (sel["window"] == window) & (sel["variant"] == "paper")]
    admissible = sel[sel["val_f1_share"].fillna(1.0) >= min_share]
    best = (
        (admissible if not admissible.empty else faithful)
        .sort_values(["val_iterations_change", "val_f1_share"], ascending=[True, False])
        .iloc[0]
    )
    per_variant = (
        admissible.sort_values(["val_iterations_change", "val_f1_share"], ascending=[True, False])
        .groupby("variant", sort=False)
        .head(1)
    )
    return Choices(
        table=_tradeoff_table(rows, faithful, per_variant, best),
        rows=rows + sel_rows,
        base_test=base_test,
        paper=fixed[0],
        faithful=faithful[faithful["selection"] == "global"].iloc[0],
        best=best,
        thresholds=thresholds,
    )


def _config_json(group: str, window: int, variant: str, chosen: dict[str, Thresholds]) -> dict:
    return {
        "feature_group": group,
        "window": window,
        "variant": variant,
        "thresholds": {ds: {"theta_p": th.theta_p, "theta_u": th.theta_u} for ds, th in chosen.items()},
    }


def _write_figure(out: Path, inputs: SweepInputs, grid: pd.DataFrame, choices: Choices) -> None:
    """data/pareto.csv (the faithful heuristic's test points on the chosen head) and Figure 5."""
    group, window = inputs.chosen_head
    faithful_grid = grid[(grid["feature_group"] == group) & (grid["window"] == window) & (grid["variant"] == "paper")]
    points = aggregate(faithful_grid[faithful_grid["split"] == "test"], ["theta_p", "theta_u"])
    front = pareto_front(points)
    front.to_csv(out / DATA / "pareto.csv", index=False)
    faithful, best = choices.faithful, choices.best
    marked = pd.DataFrame(
        [
            {**choices.paper, "label": f"paper θ=({PAPER_THRESHOLDS.theta_p}, {PAPER_THRESHOLDS.theta_u})"},
            {
                **faithful.to_dict(),
                "label": f"paper heuristic, val-chosen θ=({faithful['theta_p']:.3g}, {faithful['theta_u']:.3g})",
            },
            {
                **best.to_dict(),
                "label": f"best on val: {best['variant']} {best['feature_group']}/w{int(best['window'])} ({best['selection']})",
            },
        ]
    )
    everything = aggregate(grid[grid["split"] == "test"], ["feature_group", "window", "variant", "theta_p", "theta_u"])
    title = f"Iterations vs F1 on {inputs.questions['test']} test questions ({head_name(inputs.chosen_head)})"
    figure5(out / FIGURE, points, front, choices.base_test, marked, title, envelope=pareto_front(everything))


def write_outputs(out: Path, inputs: SweepInputs, grid: pd.DataFrame, choices: Choices, min_share: float) -> dict:
    """Step 4: the tables, the Pareto front, Figure 5, selected.json and the Markdown trade-off; returns selected."""
    to_frame(choices.rows).assign(protocol=inputs.protocol).to_csv(out / DATA / "selections.csv", index=False)
    choices.table.assign(protocol=inputs.protocol).to_csv(out / f"{TRADEOFF}.csv", index=False)
    _write_figure(out, inputs, grid, choices)
    group, window = inputs.chosen_head
    best = choices.best
    key_best = (best["feature_group"], int(best["window"]), best["variant"], best["selection"])
    selected = {
        "paper": _config_json(group, window, "paper", {"*": PAPER_THRESHOLDS}),
        "faithful": _config_json(group, window, "paper", choices.thresholds[(group, window, "paper", "global")]),
        "best": _config_json(*key_best[:3], choices.thresholds[key_best]),
        "min_f1_share": min_share,
        "questions": inputs.questions,
        "protocol": inputs.protocol,
        "excluded": inputs.excluded,
        "variants": {name: vars(opts) for name, opts in VARIANTS.items()},
    }
    (out / SELECTED).write_text(json.dumps(selected, indent=2, default=str))
    named = {
        "natural": choices.base_test.set_index("controller").loc["natural"],
        "paper": choices.paper,
        "faithful": choices.faithful,
        "best": best,
    }
    intro = f"{summary(named, inputs.questions, min_share)}\n\n{inputs.protocol}."
    (out / f"{TRADEOFF}.md").write_text(markdown(choices.table, intro))
    return selected


def run_sweep(
    run: RunDir,
    cfg: StoppingConfig,
    experiment: str | None = None,
    train: TrainConfig | None = None,
    seed: int = 0,
    train_run: RunDir | None = None,
    question_types: Mapping[str, str] | None = None,
) -> SweepReport:
    """The whole stage on one run directory (Ray initialised by the caller).

    ``train`` (the run's predictor settings) is needed for head refits (``cfg.refits``); without it, or
    without the signals a refit's group needs (``features/``, ``sup_signals/``), refits are skipped.
    ``train_run``: choose thresholds on that run's questions, report on this run's (:func:`load_inputs`);
    ``question_types`` feed the refits' type one-hot.
    """
    started = time.monotonic()
    out = run.path / STOPPING_DIR
    (out / DATA).mkdir(parents=True, exist_ok=True)
    inputs = load_inputs(run, cfg, train, train_run, question_types)
    grid = sweep_grid(inputs, cfg, out, experiment or time.strftime("sweep-%Y%m%d-%H%M%S"), train, seed)
    choices = choose(inputs, grid, cfg.min_f1_share)
    selected = write_outputs(out, inputs, grid, choices, cfg.min_f1_share)
    return SweepReport(choices.table, selected, out, inputs.excluded, time.monotonic() - started)


# ---------------------------------------------------------------- Ray Tune adapter


def _trial_head(head: list, payload: dict) -> tuple[HeadKey, Predictions]:
    """A trial's head: ``["grid", group, window]`` (predictions of jobs/train.py) or ``["refit", i]``."""
    if head[0] == "grid":
        key = (head[1], int(head[2]))
        return key, payload["predictions"][key]
    refit = payload["refits"][int(head[1])]
    preds = refit_predictions(payload["refit_frame"], refit, payload["train"], payload["seed"], payload["train_qids"])
    return (refit_label(refit), refit.window), preds


def stopping_trial(config: dict, payload: dict) -> None:
    """One Tune trial: the whole threshold grid of every variant for one prediction head."""
    from ray import tune

    (group, window), predictions = _trial_head(config["head"], payload)
    grid = evaluate_grid(
        payload["trajectories"],
        predictions,
        payload["variants"],
        payload["theta_p"],
        payload["theta_u"],
        payload["split_of"],
    ).assign(feature_group=group, window=window)
    with tempfile.TemporaryDirectory() as tmp:
        grid.to_parquet(Path(tmp) / "grid.parquet")
        checkpoint = tune.Checkpoint.from_directory(tmp)
        for step, variant in enumerate(payload["variants"]):
            part = grid[grid["variant"] == variant]
            chosen = choose_thresholds(part, payload["min_f1_share"])
            val, test = score_choice(part, chosen, "val"), score_choice(part, chosen, "test")
            metrics = {
                "variant_index": step,
                "theta_p": chosen["*"].theta_p,
                "theta_u": chosen["*"].theta_u,
                **{f"val_{k}": float(val[k]) for k in ("iterations_change", "f1_share", "tokens_saved", "mean_f1")},
                **{f"test_{k}": float(test[k]) for k in ("iterations_change", "f1_share", "tokens_saved", "mean_f1")},
            }
            last = step == len(payload["variants"]) - 1
            tune.report(metrics, checkpoint=checkpoint if last else None)


def run_tune(
    trajectories: Sequence[Trajectory],
    heads: Mapping[HeadKey, Predictions],
    split_of: Mapping[str, str],
    *,
    variants: Sequence[str],
    theta_p: Sequence[float],
    theta_u: Sequence[float],
    min_f1_share: float,
    storage_path: str | Path,
    name: str = "stopping",
    max_concurrent_trials: int = 2,
    trial_num_cpus: float = 0.5,
    refits: Sequence[HeadRefit] = (),
    refit_frame: pd.DataFrame | None = None,
    train: TrainConfig | None = None,
    seed: int = 0,
    train_qids: set[str] | None = None,
) -> pd.DataFrame:
    """Run the sweep as a Tune experiment (Ray must be initialised): the grid of every head.

    One trial per head of ``heads`` and per refit (head training settings fit on ``refit_frame``,
    :mod:`raypipe.stopping.refit`); the grid has ``feature_group`` and ``window`` columns naming it.
    """
    from ray import tune

    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown heuristic variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
    if refits and (refit_frame is None or train is None):
        raise ValueError("head refits need the features frame and the train config")
    payload = {
        "trajectories": list(trajectories),
        "predictions": dict(heads),
        "split_of": dict(split_of),
        "variants": list(variants),
        "theta_p": list(theta_p),
        "theta_u": list(theta_u),
        "min_f1_share": min_f1_share,
        "refits": list(refits),
        "refit_frame": refit_frame,
        "train": train,
        "seed": seed,
        "train_qids": train_qids,
    }
    trial_heads = [["grid", g, w] for g, w in heads] + [["refit", i] for i in range(len(refits))]
    trainable = tune.with_resources(tune.with_parameters(stopping_trial, payload=payload), {"cpu": trial_num_cpus})
    tuner = tune.Tuner(
        trainable,
        param_space={"head": tune.grid_search(trial_heads)},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent_trials),
        run_config=tune.RunConfig(storage_path=str(Path(storage_path).resolve()), name=name, verbose=0),
    )
    results = tuner.fit()
    frames = []
    for result in results:
        if result.error is not None:
            raise RuntimeError(f"Tune trial {result.config.get('head')} failed: {result.error}")
        with result.checkpoint.as_directory() as folder:
            frames.append(pd.read_parquet(Path(folder) / "grid.parquet"))
    log.info("Tune experiment %s: %d trials, logs in %s", name, len(frames), Path(storage_path) / name)
    return pd.concat(frames, ignore_index=True)


DESCRIPTION = """Sweep prediction-guided early stopping on Ray Tune: thresholds x variants x heads, Figure 5.

Reads RUN_DIR/iterations/, trajectories/ (jobs/probe.py) and predictions/ (+ prediction_grid/,
jobs/train.py). With --train-run TRAIN_RUN_DIR thresholds are chosen on that run's questions and
reported on RUN_DIR's (the paper's protocol); without, RUN_DIR is split into validation and test. Replays the seed paper's 4-state heuristic over the θ_P x θ_U grid for every named
variant and prediction head (prediction_grid, plus head refits with other training settings,
stopping.refits) as a Ray Tune experiment (one trial per head; TensorBoard:
`tensorboard --logdir RUN_DIR/stopping/tune`), chooses thresholds on validation questions and reports
them on test questions next to natural stopping and Cap@k. Writes RUN_DIR/stopping/: 01_tradeoff.md/.csv,
02_figure5.png, selected.json (for the online controller), data/ (grid, selections, Pareto front), tune/.
The run's own config.yaml is the base configuration unless --config names another; settings: stopping.*.
"""


def main() -> None:
    parser = job_parser(DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with iterations/ and predictions/")
    add_train_run_argument(parser)
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    config = run_config_from_args(args, run.path)
    train_run = resolve_train_run(config, args.train_run, run)
    try:
        for r in (run, *([train_run] if train_run else [])):
            check_inputs(r)
    except RunDirError as exc:
        raise SystemExit(f"error: {exc}") from None

    import ray

    init_ray(config, log_to_driver=False)
    try:
        types = {}
        if config.train.include_type and config.stopping.refits:
            types = {**run_question_types(run.path), **(run_question_types(train_run.path) if train_run else {})}
        report = run_sweep(run, config.stopping, train=config.train, seed=config.seed, train_run=train_run,
                           question_types=types)  # fmt: skip
    except (RunDirError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        ray.shutdown()
    run.write_config(config, "sweep")

    q = report.selected["questions"]
    print(
        f"\n{q['val']} validation / {q['test']} test questions, {report.seconds:.0f} s; left out: {report.excluded or 'none'}\n"
    )
    print((report.out_dir / f"{TRADEOFF}.md").read_text())
    print(
        f"(tables, {FIGURE} and selected.json in {report.out_dir}; TensorBoard: tensorboard --logdir {report.out_dir / 'tune'})"
    )
