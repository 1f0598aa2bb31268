"""The sweep stage (jobs/sweep.py): Tune sweep, selection on validation, test tables, Figure 5.

Reads ``iterations/``, ``trajectories/``, ``predictions/`` (and ``prediction_grid/`` for other heads)
and writes ``RUN_DIR/stopping/``: ``01_tradeoff.md``/``.csv`` (test questions: natural, Cap@k, the
heuristic at the paper's thresholds, validation-chosen operating points, with a summary against the
paper's operating point), ``02_figure5.png``, ``selected.json`` (the chosen configurations, loadable
by the online controller), ``data/`` (``grid.parquet``: every head × variant × θ pair's outcome sums
per split and dataset; ``selections.csv``: every validation choice scored on test; ``pareto.csv``)
and ``tune/`` (the Tune experiment; ``tensorboard --logdir RUN_DIR/stopping/tune``). The report job
shows the numbered files.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raypipe.core.config import StoppingConfig, TrainConfig
from raypipe.core.jobargs import job_parser, run_config_from_args, setup_logging
from raypipe.core.rundir import RunDir, RunDirError
from raypipe.runtime.cluster import init_ray
from raypipe.stopping.grid import (
    VARIANTS,
    HeadKey,
    aggregate,
    baseline_rows,
    choose_thresholds,
    controller_rows,
    cross_fit,
    head_name,
    pareto_front,
    predictions_by_head,
    run_tune,
    score_choice,
    threshold_grid,
)
from raypipe.stopping.heuristic import PAPER_THRESHOLDS, Thresholds, replay_controller
from raypipe.stopping.refit import head_frame, refit_columns, refit_label, resolve
from raypipe.stopping.replay import Trajectory, load_trajectories, split_qids
from raypipe.stopping.tradeoff import figure5, markdown, summary, table_row, to_frame

log = logging.getLogger(__name__)
STOPPING_DIR = "stopping"
SELECTED = "selected.json"
TRADEOFF = "01_tradeoff"
FIGURE = "02_figure5.png"
DATA = "data"


@dataclass
class SweepReport:
    table: pd.DataFrame  # the trade-off table (test questions)
    selected: dict  # what selected.json holds
    out_dir: Path
    excluded: dict[str, int]
    seconds: float


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


def _config_json(group: str, window: int, variant: str, chosen: dict[str, Thresholds]) -> dict:
    return {
        "feature_group": group,
        "window": window,
        "variant": variant,
        "thresholds": {ds: {"theta_p": th.theta_p, "theta_u": th.theta_u} for ds, th in chosen.items()},
    }


def run_sweep(
    run: RunDir, cfg: StoppingConfig, experiment: str | None = None, train: TrainConfig | None = None, seed: int = 0
) -> SweepReport:
    """The whole stage on one run directory (Ray initialised by the caller).

    ``train`` (the run's predictor settings) is needed for head refits (``cfg.refits``); without it, or
    without the signals a refit's group needs (``features/``, ``sup_signals/``), refits are skipped.
    """
    started = time.monotonic()
    out = run.path / STOPPING_DIR
    data = out / DATA
    data.mkdir(parents=True, exist_ok=True)
    trajectories, excluded = load_trajectories(run)
    chosen_head, heads = load_heads(run, cfg.heads)
    chosen_preds = heads[chosen_head]
    keep: list[Trajectory] = [t for t in trajectories if t.n_iterations == 0 or t.qid in chosen_preds]
    if len(keep) < len(trajectories):
        excluded["no_predictions"] = len(trajectories) - len(keep)
        log.warning("%d questions have no predictions and are left out", len(trajectories) - len(keep))
    val, test = split_qids([t.qid for t in keep], cfg.val_fraction, cfg.split_seed)
    if not val or not test:
        raise ValueError(f"{len(keep)} questions are too few for a validation/test split")
    split_of = {**{q: "val" for q in val}, **{q: "test" for q in test}}
    val_preds = [pu for q in val for pu in chosen_preds.get(q, {}).values()]
    theta_p = threshold_grid(cfg.theta_p_grid, [p for p, _ in val_preds], cfg.quantile_points)
    theta_u = threshold_grid(cfg.theta_u_grid, [u for _, u in val_preds], cfg.quantile_points)
    log.info(
        "%d questions (%d val, %d test), %d heads (+%d refits) x %d variants x %d θ_P x %d θ_U",
        len(keep), len(val), len(test), len(heads), len(cfg.refits), len(cfg.variants), len(theta_p), len(theta_u),
    )  # fmt: skip

    refits, refit_frame = [], None
    if cfg.refits and (train is None or not run.has("features")):
        log.warning("no %s: head refits skipped", "features table" if train is not None else "train config")
    elif cfg.refits:
        refit_frame = head_frame(run)
        for refit in (resolve(r, train) for r in cfg.refits):
            missing = [c for c in refit_columns(refit, train) if c not in refit_frame.columns]
            if missing:
                log.warning("head refit %s skipped: the run has no signals %s", refit_label(refit), missing)
            else:
                refits.append(refit)
    grid = run_tune(
        keep, heads, split_of, variants=cfg.variants, theta_p=theta_p, theta_u=theta_u,
        min_f1_share=cfg.min_f1_share, storage_path=out / "tune",
        name=experiment or time.strftime("sweep-%Y%m%d-%H%M%S"),
        max_concurrent_trials=cfg.max_concurrent_trials, trial_num_cpus=cfg.trial_num_cpus,
        refits=refits, refit_frame=refit_frame, train=train, seed=seed,
    )  # fmt: skip
    grid.to_parquet(data / "grid.parquet")

    base = pd.DataFrame(baseline_rows(keep, split_of))
    base_test = aggregate(base[base["split"] == "test"], ["controller"])
    base_val = aggregate(base[base["split"] == "val"], ["controller"]).set_index("controller")
    base_all = aggregate(base, ["controller"]).set_index("controller")
    rows = [
        table_row(
            r["controller"], r, base_val.loc[r["controller"]], base_all.loc[r["controller"]], selection="baseline"
        )
        for _, r in base_test.iterrows()
    ]
    group, window = chosen_head
    paper_points = []
    for th in (PAPER_THRESHOLDS, Thresholds(PAPER_THRESHOLDS.theta_p, 0.3)):
        fixed = pd.DataFrame(controller_rows(keep, replay_controller(chosen_preds, th), split_of, controller="fixed"))
        t, v = (aggregate(fixed[fixed["split"] == s], ["controller"]).iloc[0] for s in ("test", "val"))
        row = table_row("heuristic[paper]", t, v, aggregate(fixed, ["controller"]).iloc[0], feature_group=group, window=window, variant="paper",
                        theta_p=th.theta_p, theta_u=th.theta_u, selection="paper θ")  # fmt: skip
        rows.append(row)
        paper_points.append(row)
    sel_rows, choices = _selection_rows(grid, cfg.min_f1_share)
    sel = to_frame(sel_rows)

    faithful = sel[(sel["feature_group"] == group) & (sel["window"] == window) & (sel["variant"] == "paper")]
    admissible = sel[sel["val_f1_share"].fillna(1.0) >= cfg.min_f1_share]
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
    shown = pd.concat([to_frame(rows), faithful, per_variant])
    table = shown.drop_duplicates(subset=[c for c in shown.columns if c != "note"], keep="first").reset_index(drop=True)
    same = (
        table[["feature_group", "variant", "selection"]] == best[["feature_group", "variant", "selection"]].values
    ).all(axis=1)
    mark = same & (table["window"] == best["window"])
    table.loc[mark, "note"] = ("best on validation " + table.loc[mark, "note"].fillna("")).str.strip()
    to_frame(rows + sel_rows).to_csv(data / "selections.csv", index=False)
    table.to_csv(out / f"{TRADEOFF}.csv", index=False)

    faithful_grid = grid[(grid["feature_group"] == group) & (grid["window"] == window) & (grid["variant"] == "paper")]
    points = aggregate(faithful_grid[faithful_grid["split"] == "test"], ["theta_p", "theta_u"])
    front = pareto_front(points)
    front.to_csv(data / "pareto.csv", index=False)
    faithful_global = faithful[faithful["selection"] == "global"].iloc[0]
    marked = pd.DataFrame(
        [
            {**paper_points[0], "label": f"paper θ=({PAPER_THRESHOLDS.theta_p}, {PAPER_THRESHOLDS.theta_u})"},
            {
                **faithful_global.to_dict(),
                "label": f"paper heuristic, val-chosen θ=({faithful_global['theta_p']:.3g}, {faithful_global['theta_u']:.3g})",
            },
            {
                **best.to_dict(),
                "label": f"best on val: {best['variant']} {best['feature_group']}/w{int(best['window'])} ({best['selection']})",
            },
        ]
    )
    everything = aggregate(grid[grid["split"] == "test"], ["feature_group", "window", "variant", "theta_p", "theta_u"])
    title = f"Iterations vs F1 on {len(test)} test questions ({head_name(chosen_head)})"
    figure5(out / FIGURE, points, front, base_test, marked, title, envelope=pareto_front(everything))

    key_best = (best["feature_group"], int(best["window"]), best["variant"], best["selection"])
    selected = {
        "paper": _config_json(group, window, "paper", {"*": PAPER_THRESHOLDS}),
        "faithful": _config_json(group, window, "paper", choices[(group, window, "paper", "global")]),
        "best": _config_json(*key_best[:3], choices[key_best]),
        "min_f1_share": cfg.min_f1_share,
        "questions": {"val": len(val), "test": len(test)},
        "excluded": excluded,
        "variants": {name: vars(opts) for name, opts in VARIANTS.items()},
    }
    (out / SELECTED).write_text(json.dumps(selected, indent=2, default=str))
    named = {
        "natural": base_test.set_index("controller").loc["natural"],
        "paper": paper_points[0],
        "faithful": faithful_global,
        "best": best,
    }
    (out / f"{TRADEOFF}.md").write_text(markdown(table, summary(named, selected["questions"], cfg.min_f1_share)))
    return SweepReport(table, selected, out, excluded, time.monotonic() - started)


DESCRIPTION = """Sweep prediction-guided early stopping on Ray Tune: thresholds x variants x heads, Figure 5.

Reads RUN_DIR/iterations/, trajectories/ (jobs/probe.py) and predictions/ (+ prediction_grid/,
jobs/train.py). Replays the seed paper's 4-state heuristic over the θ_P x θ_U grid for every named
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
    args = parser.parse_args()
    setup_logging(args.verbose)
    run = RunDir(args.run_dir)
    config = run_config_from_args(args, run.path)
    try:
        check_inputs(run)
    except RunDirError as exc:
        raise SystemExit(f"error: {exc}") from None

    import ray

    init_ray(config, log_to_driver=False)
    try:
        report = run_sweep(run, config.stopping, train=config.train, seed=config.seed)
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
