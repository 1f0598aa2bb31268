"""The tuned agent's figures on a probe run (the dev split's): what issue 43's targets and the manifest's ``dev``
entry hold.

- answer quality: final F1 and EM, each trajectory's own answer (``stop_reason == answer``);
- retrieval helps: mean P_0 and mean P at each trajectory's last iteration, and their difference;
- the paper's RQ-1: the share of trajectories whose best P_i comes strictly before their last iteration (natural
  termination), and the distribution of U_i (i >= 1): mean, shares above, below and at 0.
"""

from __future__ import annotations

from raypipe.core.metrics import exact_match
from raypipe.core.rundir import RunDir
from raypipe.core.schema import STOP_ANSWER
from raypipe.core.stats import mean_or_nan

DEFAULT_F1_BAR = 0.15  # the bar for the artifact to become the embedded default
DEFAULT_GAIN_BAR = 0.05  # ... and retrieval must help by this much (P_last - P_0)


def dev_figures(run_dir: RunDir) -> dict:
    """The figures of ``run_dir``'s trajectories (see the module docstring), overall and final F1 per dataset."""
    rule = run_dir.metric_rule()
    trajectories = run_dir.read(
        "trajectories", columns=["qid", "dataset", "golden_answers", "final_answer", "final_f1", "stop_reason"]
    ).to_pylist()
    rows = run_dir.read("iterations", columns=["qid", "iteration", "probe_f1", "utility"]).to_pylist()
    by_qid: dict[str, dict[int, float]] = {}
    for row in rows:
        if row["probe_f1"] is not None:
            by_qid.setdefault(row["qid"], {})[row["iteration"]] = row["probe_f1"]
    probed = [by_qid[t["qid"]] for t in trajectories if t["qid"] in by_qid]
    p0 = [p[0] for p in probed if 0 in p]
    p_last = [p[max(p)] for p in probed]
    best_before_end = [max(v for i, v in p.items() if i < max(p)) > p[max(p)] for p in probed if len(p) > 1]
    utilities = [r["utility"] for r in rows if r["iteration"] >= 1 and r["utility"] is not None]
    figures = {
        "questions": len(trajectories),
        "final_f1": mean_or_nan(t["final_f1"] or 0.0 for t in trajectories),
        "final_em": mean_or_nan(exact_match(t["final_answer"], t["golden_answers"], rule) for t in trajectories),
        "own_answer_share": mean_or_nan(t["stop_reason"] == STOP_ANSWER for t in trajectories),
        "p0": mean_or_nan(p0),
        "p_last": mean_or_nan(p_last),
        "retrieval_gain": mean_or_nan(p_last) - mean_or_nan(p0),
        "best_before_end_share": mean_or_nan(best_before_end),
        "utility": {
            "n": len(utilities),
            "mean": mean_or_nan(utilities),
            "positive_share": mean_or_nan(u > 0 for u in utilities),
            "negative_share": mean_or_nan(u < 0 for u in utilities),
            "zero_share": mean_or_nan(u == 0 for u in utilities),
        },
        "final_f1_by_dataset": {
            name: mean_or_nan(t["final_f1"] or 0.0 for t in trajectories if t["dataset"] == name)
            for name in sorted({t["dataset"] for t in trajectories})
        },
    }
    figures["meets_default_bar"] = (
        figures["final_f1"] >= DEFAULT_F1_BAR and figures["retrieval_gain"] >= DEFAULT_GAIN_BAR
    )
    return figures


def format_figures(figures: dict) -> str:
    u = figures["utility"]
    lines = [
        f"questions                      {figures['questions']}",
        f"final F1 / EM                  {figures['final_f1']:.3f} / {figures['final_em']:.3f}",
        f"own answers                    {figures['own_answer_share']:.1%}",
        f"P_0 -> P_last (gain)           {figures['p0']:.3f} -> {figures['p_last']:.3f} "
        f"({figures['retrieval_gain']:+.3f})",
        f"best P_i before the end        {figures['best_before_end_share']:.1%} of trajectories with 2+ probes",
        (
            f"U_i (i >= 1, n={u['n']})          mean {u['mean']:+.3f}; > 0 {u['positive_share']:.1%}, "
            f"< 0 {u['negative_share']:.1%}, = 0 {u['zero_share']:.1%}"
        ),
        "final F1 by dataset            "
        + ", ".join(f"{k} {v:.3f}" for k, v in figures["final_f1_by_dataset"].items()),
        f"default bar (F1 >= {DEFAULT_F1_BAR}, gain >= {DEFAULT_GAIN_BAR})  "
        + ("met" if figures["meets_default_bar"] else "not met"),
    ]
    return "\n".join(lines)
