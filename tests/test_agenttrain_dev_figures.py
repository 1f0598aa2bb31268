"""The tuned agent's dev figures (issue 43) on hand-made runs, and agent-eval's checks before it writes a manifest."""

from __future__ import annotations

import json

import pytest
import yaml

from raypipe.agenttrain.dev_figures import dev_figures
from raypipe.core.adapter import ADAPTER_FILE, MANIFEST_FILE, sha256_of
from raypipe.core.rundir import RunDir
from raypipe.core.schema import STOP_ANSWER, STOP_MAX_TURNS, conform
from raypipe.stages import agent_eval


def hand_made_run(path) -> RunDir:
    """Two questions: q1 P = 0, 0.5, 1 (answers "x y" right); q2 P = 0.5, 1, 0 (best before the end, no answer)."""
    its, trajs = [], []
    for qid, ps, answer, reason in (
        ("q1", [0.0, 0.5, 1.0], "x y", STOP_ANSWER),
        ("q2", [0.5, 1.0, 0.0], None, STOP_MAX_TURNS),
    ):
        for i, p in enumerate(ps):
            its.append(
                {
                    "qid": qid,
                    "dataset": "hotpotqa" if qid == "q1" else "musique",
                    "iteration": i,
                    "probe_f1": p,
                    "utility": None if i == 0 else p - ps[i - 1],
                    "query": None,
                    "doc_ids": [],
                    "doc_scores": [],
                    "reasoning": "",
                    "probe_answer": "",
                    "probe_token_logprobs": [],
                    "tokens_generated": 1,
                    "probe_tokens": 1,
                }
            )
        trajs.append(
            {
                "qid": qid,
                "dataset": its[-1]["dataset"],
                "question": "?",
                "golden_answers": ["X y"],
                "final_answer": answer,
                "final_f1": ps[-1],
                "n_iterations": 2,
                "stop_reason": reason,
                "error": None,
                "tokens_generated": 1,
                "probe_tokens": 1,
                "wall_s": 1.0,
                "transcript": "",
            }
        )
    run = RunDir(path)
    run.write_part("iterations", conform(its, "iterations"), "part-0")
    run.write_part("trajectories", conform(trajs, "trajectories"), "part-0")
    return run


def test_dev_figures_count_what_the_targets_name(tmp_path):
    f = dev_figures(hand_made_run(tmp_path))
    assert f["questions"] == 2 and f["final_f1"] == 0.5 and f["final_em"] == 0.5 and f["own_answer_share"] == 0.5
    assert (f["p0"], f["p_last"], f["retrieval_gain"]) == (0.25, 0.5, 0.25)
    assert f["best_before_end_share"] == 0.5  # q2's best (1.0 at i=1) comes before its end (0.0)
    u = f["utility"]  # 0.5, 0.5, 0.5, -1.0
    assert (
        u["n"] == 4
        and u["mean"] == pytest.approx(0.125)
        and u["positive_share"] == 0.75
        and u["negative_share"] == 0.25
    )
    assert f["final_f1_by_dataset"] == {"hotpotqa": 1.0, "musique": 0.0}
    assert f["meets_default_bar"]


def artifact(tmp_path):
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / ADAPTER_FILE).write_bytes(b"factors")
    (folder / MANIFEST_FILE).write_text(json.dumps({"adapter_sha256": sha256_of(folder / ADAPTER_FILE), "dev": {}}))
    return folder


@pytest.mark.parametrize(
    ("data", "adapter", "refused"),
    [
        ({"split": "dev", "limit": None}, "artifact", None),
        ({"split": "dev", "limit": 4}, "artifact", "not the whole dev split"),
        ({"split": "all", "limit": None}, "artifact", "not the whole dev split"),
        ({"split": "dev", "limit": None}, None, "ran engine.adapter=None"),
        ({"split": "dev", "limit": None}, "smollm2-searchr1", "ran engine.adapter=smollm2-searchr1"),  # another one
    ],
)
def test_agent_eval_records_only_the_artifacts_whole_dev_run(tmp_path, capsys, data, adapter, refused):
    run, folder = hand_made_run(tmp_path / "run"), artifact(tmp_path)
    (run.path / "config.yaml").write_text(
        yaml.safe_dump({"data": data, "engine": {"adapter": str(folder) if adapter == "artifact" else adapter}})
    )
    if refused:
        with pytest.raises(SystemExit, match=refused):
            agent_eval.main([str(run.path), "--artifact", str(folder)])
        assert json.loads((folder / MANIFEST_FILE).read_text())["dev"] == {}
    else:
        agent_eval.main([str(run.path), "--artifact", str(folder)])
        dev = json.loads((folder / MANIFEST_FILE).read_text())["dev"]
        assert dev["final_f1"] == 0.5 and dev["run"] == str(run.path)
    assert "final F1 / EM" in capsys.readouterr().out


def test_agent_eval_says_what_is_missing_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="error: .*no trajectories table here"):
        agent_eval.main([str(tmp_path)])
    run = hand_made_run(tmp_path / "run")
    with pytest.raises(SystemExit, match="error: .*not a tuned-agent artifact"):
        agent_eval.main([str(run.path), "--artifact", str(tmp_path / "nothing")])
