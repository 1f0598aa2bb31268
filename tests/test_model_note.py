"""The embedded LLM's caveat goes beside every answer figure its runs show: the stages' printed tables, the
report page and the comparison page; runs of any other model show none."""

from __future__ import annotations

from html import unescape

import pytest
import yaml

from raypipe.analysis.run_compare import compare_runs, write_comparison
from raypipe.core.config import ReportConfig, load_config
from raypipe.core.models import EMBEDDED_LLMS, embedded_llm_note
from raypipe.core.rundir import RunDir, model_notes
from raypipe.runtime.stage_main import print_model_note
from raypipe.stages.report import build_report
from tests.helpers.analysis_run import build_run_dir

TUNED = embedded_llm_note("smollm2", "smollm2-searchr1")  # the embedded preset's agent


def _set_model(run: RunDir, model: str) -> RunDir:
    path = run.path / "config.yaml"
    tree = yaml.safe_load(path.read_text())
    tree["engine"]["model"] = model
    path.write_text(yaml.safe_dump(tree))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_note")
    embedded = build_run_dir(root / "embedded")  # the embedded preset: smollm2 with the bundled tuned agent
    other = _set_model(build_run_dir(root / "qwen"), "/models/Qwen2.5-7B-Instruct")
    return embedded, other


def test_the_note_names_the_embedded_model_and_nothing_else_gets_one():
    note = embedded_llm_note("smollm2")
    assert note is not None and "SmolLM2-135M-Instruct" in note and "not the science" in note
    assert set(EMBEDDED_LLMS) == {"smollm2"}  # a new embedded LLM gets the note through this table
    for other in ("/models/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-3B-Instruct", None):
        assert embedded_llm_note(other) is None


def test_a_tuned_agent_gets_a_note_that_names_it():
    note = embedded_llm_note("smollm2", "smollm2-searchr1")
    assert note is not None and "SmolLM2-135M-Instruct" in note and "smollm2-searchr1" in note
    assert "not a published checkpoint" in note and note != embedded_llm_note("smollm2")
    assert embedded_llm_note("/models/Qwen2.5-7B-Instruct", "some-artifact") is None


def test_a_run_dir_reads_its_model_from_its_config(runs, tmp_path):
    embedded, other = runs
    assert embedded.recorded("engine", "model") == "smollm2"
    assert embedded.model_note() == TUNED
    untuned = RunDir(tmp_path / "untuned")
    untuned.path.mkdir()
    untuned.write_config(load_config("embedded-untuned"))
    assert untuned.model_note() == embedded_llm_note("smollm2")
    assert other.model_note() is None
    assert RunDir(tmp_path).model_note() is None  # no config.yaml: nothing to say
    assert model_notes([embedded, other, embedded, untuned]) == [TUNED, embedded_llm_note("smollm2")]


def test_printed_once_under_the_tables(runs, capsys):
    embedded, other = runs
    print_model_note(embedded, embedded, other)
    assert capsys.readouterr().out == f"\nnote: {TUNED}.\n"
    print_model_note(other)
    assert capsys.readouterr().out == ""


def test_the_report_page_carries_it_only_for_the_embedded_model(runs, tmp_path):
    embedded, other = runs
    note = TUNED
    fast = ReportConfig(bootstrap_samples=50)
    with_note = build_report(embedded.path, fast, tmp_path / "embedded")
    assert note in with_note.markdown.read_text() and note in unescape(with_note.html.read_text())
    without = build_report(other.path, fast, tmp_path / "other")
    assert "SmolLM2" not in without.markdown.read_text()


def test_the_comparison_page_carries_it_when_any_run_is_embedded(runs, tmp_path):
    embedded, other = runs
    html, md = write_comparison(compare_runs([other.path, embedded.path], samples=50), tmp_path / "page")
    assert TUNED in md.read_text() and TUNED in unescape(html.read_text())
    second = _set_model(build_run_dir(tmp_path / "llama"), "/models/Llama-3.1-8B-Instruct")
    html, md = write_comparison(compare_runs([other.path, second.path], samples=50), tmp_path / "alone")
    assert "SmolLM2" not in md.read_text()
