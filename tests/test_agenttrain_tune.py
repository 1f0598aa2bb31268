"""The agent's fine-tuning (issue 43), LoRA and full: the loss on the agent's own tokens only, a few steps lower
it, a run resumes where it stopped, and the artifact merged at conversion computes what the trained model
computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from raypipe.agenttrain.trajectories import AGENT, CONTEXT, PROMPT
from raypipe.agenttrain.tune import IGNORE, AgentTuning, encode, loop_config, write_artifact
from raypipe.core.adapter import ADAPTER_FILE, MANIFEST_FILE, ArtifactError, apply_artifact, sha256_of
from raypipe.core.config import load_config
from raypipe.core.models import resolve_llm
from raypipe.core.training import LocalWorker
from tests.helpers.tiny_models import tiny_llama


def rows(n: int = 4) -> list[dict]:
    """Trajectories shaped as agent-data writes them (segments of a prompt, agent turns and observations)."""
    names = ["Paris", "Berlin", "Rome", "Madrid", "Vienna", "Lisbon"]
    out = []
    for i in range(n):
        city = names[i % len(names)]
        prompt = f"<|im_start|>user\nWhere is monument {i}?<|im_end|>\n<|im_start|>assistant\n"
        search = "<think> I have no information yet. </think>\n<search> monument </search>"
        docs = f'\n\n<information>Doc 1(Title: "M{i}") it stands in {city}.</information>\n\n\n\n'
        answer = f"<think> The results show M{i}. That is enough. </think>\n<answer> {city} </answer>"
        segments = [(PROMPT, prompt), (AGENT, search), (CONTEXT, docs), (AGENT, answer)]
        out.append({"qid": f"q{i}", "segments": [{"kind": kind, "text": text} for kind, text in segments]})
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


def data_file(folder: Path, n: int = 4) -> Path:
    path = folder / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(n)))
    return path


def tune_config(model: Path, data: Path, **changes) -> dict:
    cfg = load_config("embedded", [f"agent_train.{k}={v}" for k, v in changes.items()]).agent_train
    return loop_config(cfg, model, data, seed=3)


def test_the_loss_mask_covers_the_agents_tokens_only(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    segments = rows(1)[0]["segments"]
    ids, labels = encode(segments, tokenizer)
    assert len(ids) == len(labels)
    labelled = [t for t, label in zip(ids, labels) if label != IGNORE]
    assert all(label in (IGNORE, t) for t, label in zip(ids, labels))
    assert tokenizer.decode(labelled) == "".join(s["text"] for s in segments if s["kind"] == AGENT)
    context = [t for t, label in zip(ids, labels) if label == IGNORE]
    assert tokenizer.decode(context) == "".join(s["text"] for s in segments if s["kind"] != AGENT)


# method -> a learning rate at which a few steps move the tiny model (full fine-tuning moves every weight)
METHODS = {"lora": 0.05, "full": 0.005}


@pytest.mark.parametrize("method", METHODS)
def test_a_few_steps_on_four_trajectories_lower_the_loss_and_a_resumed_run_ends_where_a_whole_one_does(
    tiny, tmp_path, method
):
    config = tune_config(
        tiny,
        data_file(tmp_path),
        method=method,
        epochs=3,
        grad_accum=2,
        learning_rate=METHODS[method],
        checkpoint_steps=3,
    )
    torch.manual_seed(3)
    whole = AgentTuning(config, LocalWorker())
    ends = list(whole.epochs())
    losses = [loss for end in ends for loss in end.metrics["losses"]]
    assert len(losses) == 6 and ends[-1].metrics["final"] and ends[-1].metrics["tokens"] > 0
    assert losses[-1] < 0.7 * losses[0] and sum(losses[-2:]) < sum(losses[:2]), losses

    torch.manual_seed(3)
    first = AgentTuning(config, LocalWorker())
    end = next(iter(first.epochs()))  # the first checkpoint, after 3 steps
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    end.save(checkpoint)
    torch.manual_seed(99)  # a restarted worker: other random state; the trained tensors come from the checkpoint
    resumed = AgentTuning(config, LocalWorker())
    resumed.resume(checkpoint)
    rest = list(resumed.epochs())
    assert resumed.step == 6 and rest[-1].metrics["losses"] == pytest.approx(losses[3:], rel=1e-5)
    finished = tmp_path / "finished"
    finished.mkdir()
    rest[-1].save(finished)
    rerun = AgentTuning(config, LocalWorker())  # a finished run started again: its checkpoint, no more steps
    rerun.resume(finished)
    again = list(rerun.epochs())
    assert len(again) == 1 and again[0].metrics["final"] and again[0].metrics["step"] == 6


@pytest.mark.parametrize("method", METHODS)
def test_the_artifact_applies_at_conversion_and_its_logits_are_the_trained_models(tiny, tmp_path, monkeypatch, method):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("RAYPIPE_CACHE", str(tmp_path / "cache"))
    config = tune_config(
        tiny, data_file(tmp_path), method=method, max_steps=3, grad_accum=1, learning_rate=METHODS[method]
    )
    tuning = AgentTuning(config, LocalWorker())
    end = list(tuning.epochs())[-1]
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    end.save(checkpoint)
    artifact = tmp_path / "artifact"
    manifest = write_artifact(artifact, checkpoint, config, tiny, {})
    assert manifest["base_model_sha256"] == sha256_of(tiny) and manifest["question_ids"] == ["q0", "q1", "q2", "q3"]
    assert manifest["seed"] == 3 and manifest["method"] == method and manifest["dev"] == {}
    assert (artifact / ADAPTER_FILE).stat().st_size <= 25e6  # the tiny model's; full on SmolLM2-135M: 425 MB
    suffixes = {key.rpartition(".")[2] for key in load_file(str(artifact / ADAPTER_FILE))}
    assert suffixes == ({"lora_A", "lora_B"} if method == "lora" else {"delta"})

    merged = resolve_llm(str(tiny), str(artifact))  # what an engine with engine.adapter loads
    assert merged != tiny and resolve_llm(str(tiny)) == tiny
    ids = torch.tensor([encode(rows(1)[0]["segments"], tuning_tokenizer(tiny))[0]])
    base = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    applied = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32)
    with torch.no_grad():  # the trained model: the base with LoRA factors, or with its own trained weights
        expected, got, before = (m.eval()(input_ids=ids).logits for m in (tuning.model, applied, base))
    assert (expected - before).abs().max() > 0.05  # training changes the model, far beyond the tolerance
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)  # float32 rounding of the merged weights


def test_an_altered_or_foreign_artifact_is_refused(tiny, tmp_path):
    config = tune_config(tiny, data_file(tmp_path), max_steps=1, grad_accum=1, checkpoint_steps=1)
    end = next(iter(AgentTuning(config, LocalWorker()).epochs()))
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    end.save(checkpoint)
    artifact = tmp_path / "artifact"
    write_artifact(artifact, checkpoint, config, tiny, {})
    with pytest.raises(ArtifactError, match="made for base model"):
        apply_artifact(tiny, "0" * 64, artifact, tmp_path / "out")
    manifest = json.loads((artifact / MANIFEST_FILE).read_text())
    (artifact / MANIFEST_FILE).write_text(json.dumps({**manifest, "adapter_sha256": "f" * 64}))
    with pytest.raises(ArtifactError, match="differs from the manifest"):
        apply_artifact(tiny, sha256_of(tiny), artifact, tmp_path / "out")


def tuning_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_the_embedded_default_ships_its_tuned_agent_and_the_untuned_preset_stays():
    from raypipe.core.adapter import read_manifest
    from raypipe.core.config import known_presets
    from raypipe.core.models import locate_adapter, locate_llm

    assert load_config("embedded").engine.adapter == "smollm2-searchr1"
    assert load_config("embedded-untuned").engine.adapter is None
    manifest = read_manifest(locate_adapter("smollm2-searchr1"))  # its adapter's sha256 checked
    assert manifest["base_model_sha256"] == sha256_of(locate_llm("smollm2"))  # made for the installed model
    assert manifest["adapter_bytes"] <= 25_000_000 and manifest["dev"]["meets_default_bar"]
    gpu = [p for p in known_presets() if p.endswith("-gpu")]
    assert gpu and all(load_config(p).engine.adapter is None for p in gpu)  # the published checkpoints as they are


def test_a_second_round_starts_from_the_first_rounds_factors_and_a_mismatched_one_is_refused(tiny, tmp_path):
    from raypipe.agenttrain.tune import adapter_factors, unwrap

    config = tune_config(tiny, data_file(tmp_path), max_steps=2, grad_accum=1, learning_rate=0.05, checkpoint_steps=2)
    end = list(AgentTuning(config, LocalWorker()).epochs())[-1]
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    end.save(checkpoint)
    first = tmp_path / "first"
    write_artifact(first, checkpoint, config, tiny, {})

    second = tune_config(tiny, data_file(tmp_path), max_steps=1, grad_accum=1, init_adapter=first)
    assert second["init_adapter"] == str(first)
    tuning = AgentTuning(second, LocalWorker())
    start = adapter_factors(unwrap(tuning.model))
    saved = load_file(str(first / ADAPTER_FILE))
    assert start.keys() == saved.keys() and all(torch.equal(start[k], saved[k]) for k in saved)
    assert any(saved[k].abs().max() > 0 for k in saved if k.endswith("lora_B"))  # not new (zero) factors
    manifest = write_artifact(tmp_path / "second", checkpoint, second, tiny, {})
    assert manifest["init_adapter"]["adapter_sha256"] == sha256_of(first / ADAPTER_FILE)
    with pytest.raises(ValueError, match="lora_rank differ"):
        tune_config(tiny, data_file(tmp_path), lora_rank=4, init_adapter=first)
    with pytest.raises(ValueError, match="is a lora artifact; this run's agent_train.method is full"):
        tune_config(tiny, data_file(tmp_path), method="full", init_adapter=first)
    full = AgentTuning(tune_config(tiny, data_file(tmp_path), method="full", max_steps=1), LocalWorker())
    with pytest.raises(ArtifactError, match="is not a full tensor"):  # resumed from another method's checkpoint
        full.resume(checkpoint)
