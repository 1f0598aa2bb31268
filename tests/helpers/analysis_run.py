"""A hand-built run directory whose analysis figures are worked out by hand (used by the analysis and
report tests).

hotpotqa (agent search_r1, epsilon 1e-6):
  A rising   P = 0, .5, 1        n=2 answer     final F1 1.0   U = .5 .5      net +1   reaches final at 2 (last)
  B flat     P = .5, .5, .5, .5  n=3 max_turns  final F1 0.5   U = 0 0 0      net 0    reaches final at 0, 3 extra
  C falling  P = 1, .5           n=1 answer     final F1 0.5   U = -.5        net -.5  reaches final at 0, 1 extra
  D early    P = 0, 1, 1, 1      n=3 answer     final F1 1.0   U = 1 0 0      net +1   reaches final at 1, 2 extra
musique:
  E direct   P = .25             n=0 answer     final F1 .25   no U           net 0    at 0 (last)
  F error    no iterations       n=0 engine_error  final F1 null
"""

from __future__ import annotations

from pathlib import Path

from raypipe.core.config import load_config
from raypipe.core.rundir import RunDir
from raypipe.core.schema import conform

TRAJECTORIES = {
    # qid: (dataset, P sequence, n_iterations, stop_reason, final_f1)
    "A": ("hotpotqa", [0.0, 0.5, 1.0], 2, "answer", 1.0),
    "B": ("hotpotqa", [0.5, 0.5, 0.5, 0.5], 3, "max_turns", 0.5),
    "C": ("hotpotqa", [1.0, 0.5], 1, "answer", 0.5),
    "D": ("hotpotqa", [0.0, 1.0, 1.0, 1.0], 3, "answer", 1.0),
    "E": ("musique", [0.25], 0, "answer", 0.25),
    "F": ("musique", [], 0, "engine_error", None),
}


def build_run_dir(path: Path, protocol: str = "search_r1") -> RunDir:
    run = RunDir(path)
    run.write_config(load_config("embedded", [f"agent.protocol={protocol}", "name=handbuilt"]))
    its, trajs = [], []
    for qid, (dataset, ps, n, stop, final) in TRAJECTORIES.items():
        for i, p in enumerate(ps):
            its.append(
                {
                    "qid": qid,
                    "dataset": dataset,
                    "iteration": i,
                    "query": None if i == 0 else f"q{i}",
                    "doc_ids": [] if i == 0 else ["d1", "d2"],
                    "doc_scores": [] if i == 0 else [0.9, 0.8],
                    "reasoning": "r",
                    "probe_answer": "a",
                    "probe_token_logprobs": [-0.1],
                    "probe_f1": p,
                    "utility": None if i == 0 else p - ps[i - 1],
                    "tokens_generated": 10,
                    "probe_tokens": 3,
                }
            )
        trajs.append(
            {
                "qid": qid,
                "dataset": dataset,
                "question": f"question {qid}?",
                "golden_answers": ["x"],
                "final_answer": None if final is None else "x",
                "final_f1": final,
                "n_iterations": n,
                "stop_reason": stop,
                "error": "boom" if stop == "engine_error" else None,
                "tokens_generated": 10 * (n + 1),
                "probe_tokens": 3 * len(ps),
                "wall_s": 1.0,
                "transcript": "t",
            }
        )
    # Two parts per table, as a sharded writer would leave them.
    run.write_part("iterations", conform(its[:5], "iterations"), "part-0")
    run.write_part("iterations", conform(its[5:], "iterations"), "part-1")
    run.write_part("trajectories", conform(trajs[:3], "trajectories"), "part-0")
    run.write_part("trajectories", conform(trajs[3:], "trajectories"), "part-1")
    return run
