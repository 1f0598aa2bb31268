"""The sweep job (jobs/sweep.py): Tune sweep, selection on validation, test tables, Figure 5.

Reads ``iterations/``, ``trajectories/``, ``predictions/`` (and ``prediction_grid/`` for other heads)
and writes ``RUN_DIR/stopping/``: ``01_tradeoff.md``/``.csv`` (test questions: natural, Cap@k, the
heuristic at the paper's thresholds, validation-chosen operating points, with a summary against the
paper's operating point and each row's paired tests against natural stopping), ``02_figure5.png``,
``03_significance.md``/``.csv`` (those tests in full: :mod:`raypipe.analysis.policy_tests`),
``selected.json`` (the chosen configurations, loadable
by the online controller), ``data/`` (``grid.parquet``: every head × variant × θ pair's outcome sums
per split and dataset; ``selections.csv``: every validation choice scored on test; ``pareto.csv``)
and ``tune/`` (the Tune experiment; ``raypipe dashboard RUN_DIR`` opens it in TensorBoard). The report job
shows the numbered files.

:func:`run_sweep` runs five steps: :func:`~raypipe.stopping.inputs.load_inputs`, :func:`sweep_grid` (the
only one on Ray), :func:`~raypipe.stopping.selection.choose`, :func:`~raypipe.analysis.policy_tests.sweep_pvalues`
and :func:`~raypipe.stopping.outputs.write_outputs`.
The grid maths are :mod:`raypipe.stopping.grid`'s.

Ray Tune adapter (:func:`run_tune`): one trial per prediction head (feature group × window from the
predictors' ``prediction_grid``, or a head refit with other training settings), each replaying the
whole threshold grid for every variant (trial start-up dominates on small machines, so trials are few
and fat). A trial reports, per variant, the validation-chosen operating point with its validation and
test figures (browsable in TensorBoard under the Tune storage path, and in MLflow when tracking is on)
and checkpoints its full grid (and a refit head's predictions), which the driver collects.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from raypipe.analysis.policy_tests import sweep_pvalues
from raypipe.analysis.tracking import Headline
from raypipe.core.config import HeadRefit, ReportConfig, StoppingConfig, TrainConfig
from raypipe.core.rundir import RunDir
from raypipe.predict.qtypes import run_question_types
from raypipe.runtime.stage_main import RunDirStage, StageRun, print_model_note, tune_callbacks
from raypipe.runtime.trainer import is_uri, storage_location
from raypipe.stopping.grid import HeadKey, choose_thresholds, evaluate_grid, predictions_by_head, score_choice
from raypipe.stopping.heuristic import VARIANTS, Predictions
from raypipe.stopping.inputs import SweepInputs, check_inputs, load_inputs
from raypipe.stopping.outputs import DATA, FIGURE, STOPPING_DIR, TRADEOFF, headline_figures, output_files, write_outputs
from raypipe.stopping.refit import predictions_table, trial_head
from raypipe.stopping.replay import Trajectory
from raypipe.stopping.selection import choose

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    table: pd.DataFrame  # the trade-off table (test questions)
    selected: dict  # what selected.json holds
    out_dir: Path
    excluded: dict[str, int]
    seconds: float


def sweep_grid(
    inputs: SweepInputs,
    cfg: StoppingConfig,
    out: Path,
    experiment: str,
    train: TrainConfig | None,
    seed: int,
    callbacks: Sequence = (),
    storage: str | None = None,
) -> tuple[pd.DataFrame, dict[HeadKey, Predictions]]:
    """Step 2: every head's threshold grid as a Tune experiment under ``storage`` (a path or URI; None:
    ``out/tune``), kept as data/grid.parquet; with the refit heads' predictions."""
    # Packed (fmt: skip), this call keeps the stage module under its size target (tests/test_layout.py).
    grid, refit_heads = run_tune(
        inputs.trajectories, inputs.heads, inputs.split_of, variants=cfg.variants, theta_p=inputs.theta_p,
        theta_u=inputs.theta_u, min_f1_share=cfg.min_f1_share, storage_path=storage or out / "tune", name=experiment,
        max_concurrent_trials=cfg.max_concurrent_trials, trial_num_cpus=cfg.trial_num_cpus,
        refits=inputs.refits, refit_frame=inputs.refit_frame, train=train, seed=seed, train_qids=inputs.train_qids,
        callbacks=callbacks,
    )  # fmt: skip
    grid.to_parquet(out / DATA / "grid.parquet")
    return grid, refit_heads


def run_sweep(
    run: RunDir,
    cfg: StoppingConfig,
    experiment: str | None = None,
    train: TrainConfig | None = None,
    seed: int = 0,
    train_run: RunDir | None = None,
    question_types: Mapping[str, str] | None = None,
    options: ReportConfig | None = None,
    callbacks: Sequence = (),
    storage: str | None = None,
) -> SweepReport:
    """The whole stage on one run directory (Ray initialised by the caller).

    ``train`` (the run's predictor settings) is needed for head refits (``cfg.refits``); without it, or
    without the signals a refit's group needs (``features/``, ``sup_signals/``), refits are skipped.
    ``train_run``: choose thresholds on that run's questions, report on this run's (:func:`load_inputs`);
    ``question_types`` feed the refits' type one-hot; ``options`` (the report section: correction, bootstrap)
    set the paired tests against natural stopping; ``callbacks``: Tune's (MLflow when tracking is on);
    ``storage``: where Tune keeps the experiment (a path or URI, :func:`storage_location`; None: ``stopping/tune``).
    """
    started = time.monotonic()
    out = run.path / STOPPING_DIR
    (out / DATA).mkdir(parents=True, exist_ok=True)
    inputs = load_inputs(run, cfg, train, train_run, question_types)
    name = experiment or time.strftime("sweep-%Y%m%d-%H%M%S")
    grid, refit_heads = sweep_grid(inputs, cfg, out, name, train, seed, callbacks, storage)
    choices = choose(inputs, grid, cfg.min_f1_share)
    heads = {**inputs.heads, **refit_heads}
    pvalues = sweep_pvalues(out, choices.table, inputs, heads, choices.thresholds, options or ReportConfig())
    selected = write_outputs(out, inputs, grid, choices, cfg.min_f1_share, pvalues)
    return SweepReport(choices.table, selected, out, inputs.excluded, time.monotonic() - started)


# ---------------------------------------------------------------- Ray Tune adapter


def stopping_trial(config: dict, payload: dict) -> None:
    """One Tune trial: the whole threshold grid of every variant for one prediction head."""
    from ray import tune

    (group, window), predictions = trial_head(config["head"], payload)
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
        if config["head"][0] == "refit":  # the driver has no copy of a refit head's predictions
            pq.write_table(predictions_table((group, window), predictions), Path(tmp) / "heads.parquet")
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
    callbacks: Sequence = (),
) -> tuple[pd.DataFrame, dict[HeadKey, Predictions]]:
    """Run the sweep as a Tune experiment (Ray must be initialised): the grid of every head, and the refit
    heads' predictions.

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
    location = str(storage_path) if is_uri(storage_path) else str(Path(storage_path).resolve())
    tuner = tune.Tuner(
        trainable,
        param_space={"head": tune.grid_search(trial_heads)},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent_trials),
        run_config=tune.RunConfig(storage_path=location, name=name, verbose=0, callbacks=list(callbacks)),
    )
    results = tuner.fit()
    frames, refit_heads = [], {}
    for result in results:
        if result.error is not None:
            raise RuntimeError(f"Tune trial {result.config.get('head')} failed: {result.error}")
        with result.checkpoint.as_directory() as folder:
            frames.append(pd.read_parquet(Path(folder) / "grid.parquet"))
            if (Path(folder) / "heads.parquet").exists():
                refit_heads.update(predictions_by_head(pq.read_table(Path(folder) / "heads.parquet")))
    log.info("Tune experiment %s: %d trials, logs in %s/%s", name, len(frames), location, name)
    return pd.concat(frames, ignore_index=True), refit_heads


DESCRIPTION = """Sweep prediction-guided early stopping on Ray Tune: thresholds x variants x heads, Figure 5.

Reads RUN_DIR/iterations/, trajectories/ (jobs/probe.py) and predictions/ (+ prediction_grid/,
jobs/train.py). With --train-run TRAIN_RUN_DIR thresholds are chosen on that run's questions and
reported on RUN_DIR's (the paper's protocol); without, RUN_DIR is split into validation and test. Replays the seed paper's 4-state heuristic over the θ_P x θ_U grid for every named
variant and prediction head (prediction_grid, plus head refits with other training settings,
stopping.refits) as a Ray Tune experiment (one trial per head; TensorBoard:
`raypipe dashboard RUN_DIR`), chooses thresholds on validation questions and reports
them on test questions next to natural stopping and Cap@k, each with paired tests against natural
stopping per question (F1: t and Wilcoxon signed-rank; EM: McNemar exact; iterations, tokens: signed-rank,
exact or by seeded sign flips; Holm-corrected, --set report.correction=bh for Benjamini-Hochberg). Writes RUN_DIR/stopping/: 01_tradeoff.md/.csv, 02_figure5.png, 03_significance.md/.csv,
selected.json (for the online controller), data/ (grid, selections, Pareto front), tune/.
The run's own config.yaml is the base configuration unless --config names another; settings: stopping.*,
report.correction and report.bootstrap_*; --set tracking.mlflow_uri=PATH_OR_URL logs to MLflow (trials too).
"""  # noqa: E501 - the --help text as printed; its first line is the job's summary in `raypipe`


def _check_runs(stage: StageRun) -> None:
    for r in (stage.run, *([stage.train_run] if stage.train_run else [])):
        check_inputs(r)


def _sweep(stage: StageRun) -> SweepReport:
    config, run, train_run = stage.config, stage.run, stage.train_run
    types = {}
    if config.train.include_type and config.stopping.refits:
        types = {**run_question_types(run.path), **(run_question_types(train_run.path) if train_run else {})}
    return run_sweep(
        run,
        config.stopping,
        train=config.train,
        seed=config.seed,
        train_run=train_run,
        question_types=types,
        options=config.report,
        callbacks=tune_callbacks(stage.tracker),
        storage=storage_location(config.ray.storage_path, run.path, f"{STOPPING_DIR}/tune"),
    )


def _headline(run: RunDir, report: SweepReport) -> Headline:
    return Headline({**headline_figures(report.table), "seconds": report.seconds}, output_files(report.out_dir))


STAGE = RunDirStage(
    name="sweep",
    description=DESCRIPTION,
    run_dir_help="a run directory with iterations/ and predictions/",
    train_run=True,
    check=_check_runs,
    headline=_headline,
)


def main() -> None:
    stage, report = STAGE.main(_sweep)
    q = report.selected["questions"]
    print(
        f"\n{q['val']} validation / {q['test']} test questions, {report.seconds:.0f} s; left out: "
        f"{report.excluded or 'none'}\n"
    )
    print((report.out_dir / f"{TRADEOFF}.md").read_text())
    print_model_note(stage.run)
    print(
        f"(tables, {FIGURE} and selected.json in {report.out_dir}; TensorBoard: raypipe dashboard "
        f"{report.out_dir.parent})"
    )
