"""The probe job's console summary: per dataset, questions, mean retrieval iterations, final F1, mean P_i by
iteration and stop reasons."""

from __future__ import annotations

from raypipe.core.rundir import RunDir
from raypipe.core.stats import mean_or_nan


def summarize(run_dir: RunDir) -> list[dict]:
    """Per dataset: questions, mean retrieval iterations, final F1, mean P_i by iteration, stop reasons."""
    trajectories = run_dir.read("trajectories").to_pylist()
    iterations = run_dir.read("iterations", columns=["dataset", "iteration", "probe_f1"]).to_pylist()
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
        rows.append(
            {
                "dataset": dataset,
                "questions": len(mine),
                "mean_iterations": mean_or_nan(t["n_iterations"] for t in mine),
                "final_f1": mean_or_nan(t["final_f1"] for t in mine),
                "p_by_iteration": {i: mean_or_nan(v) for i, v in sorted(by_iteration.items())},
                "stop_reasons": reasons,
            }
        )
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
    return "\n".join(lines)
