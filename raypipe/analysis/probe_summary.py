"""The probe job's console summary: per dataset, questions, mean retrieval iterations, final F1, mean P_i by
iteration and stop reasons; with an online controller, its cost: decisions, mean seconds per decision and the
decisions' share of the trajectories' wall time (summed decision_s over summed wall_s)."""

from __future__ import annotations

from raypipe.core.rundir import RunDir
from raypipe.core.stats import mean_or_nan


def summarize(run_dir: RunDir, controller: bool = False) -> list[dict]:
    """Per dataset: questions, mean retrieval iterations, final F1, mean P_i by iteration, stop reasons; with
    ``controller`` (a run with an online controller) its cost (module docstring)."""
    trajectories = run_dir.read("trajectories").to_pylist()
    columns = ["dataset", "iteration", "probe_f1", *(["decision_s"] if controller else [])]
    iterations = run_dir.read("iterations", columns=columns).to_pylist()
    rows = []
    for dataset in sorted({t["dataset"] for t in trajectories}):
        mine = [t for t in trajectories if t["dataset"] == dataset]
        by_iteration: dict[int, list[float]] = {}
        for it in iterations:
            if it["dataset"] == dataset and it["probe_f1"] is not None:
                by_iteration.setdefault(it["iteration"], []).append(it["probe_f1"])
        reasons: dict[str, int] = {}
        for t in mine:
            reasons[t["stop_reason"]] = reasons.get(t["stop_reason"], 0) + 1
        row = {
            "dataset": dataset,
            "questions": len(mine),
            "mean_iterations": mean_or_nan(t["n_iterations"] for t in mine),
            "final_f1": mean_or_nan(t["final_f1"] for t in mine),
            "p_by_iteration": {i: mean_or_nan(v) for i, v in sorted(by_iteration.items())},
            "stop_reasons": reasons,
        }
        if controller:
            decisions = [
                it["decision_s"] for it in iterations if it["dataset"] == dataset and it["decision_s"] is not None
            ]
            wall = sum(t["wall_s"] or 0.0 for t in mine)
            row["decisions"] = len(decisions)
            row["decision_s"] = mean_or_nan(decisions)
            row["controller_share"] = sum(decisions) / wall if wall > 0 else float("nan")
        rows.append(row)
    return rows


def format_summary(rows: list[dict]) -> str:
    depth = max((max(r["p_by_iteration"], default=-1) for r in rows), default=-1) + 1
    head = f"{'dataset':<18}{'questions':>10}{'mean iter':>10}{'final F1':>10}  " + "".join(
        f"{'P_' + str(i):>7}" for i in range(depth)
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ps = "".join(
            f"{r['p_by_iteration'][i]:>7.3f}" if i in r["p_by_iteration"] else f"{'':>7}" for i in range(depth)
        )
        lines.append(f"{r['dataset']:<18}{r['questions']:>10}{r['mean_iterations']:>10.2f}{r['final_f1']:>10.3f}  {ps}")
    lines.append("")
    lines += [
        f"{r['dataset']}: stop reasons " + ", ".join(f"{k} {v}" for k, v in sorted(r["stop_reasons"].items()))
        for r in rows
    ]
    lines += [
        f"{r['dataset']}: controller {r['decisions']} decisions, {1000 * r['decision_s']:.1f} ms each, "
        f"{100 * r['controller_share']:.1f}% of the trajectories' wall time"
        for r in rows
        if "decisions" in r
    ]
    return "\n".join(lines)
