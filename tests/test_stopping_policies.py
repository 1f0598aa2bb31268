"""The stopping-policy registry (issue 42): one entry per policy gives its name, settings, checks, controller and
docs line; the docs' table is the registry's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from raypipe.agents.answer_api import ApiError, Policy
from raypipe.core.config import load_config
from raypipe.runtime.answering import PolicyBook
from raypipe.stopping import policies
from raypipe.stopping.cap_online import CapController
from raypipe.stopping.policies import POLICIES, SETTINGS, Setting, StopPolicy, check_policy, policy_table

DOCS = Path(__file__).resolve().parents[1] / "docs"
STOPPING = load_config("embedded").stopping


def test_the_docs_list_the_registrys_policies():
    assert policy_table() in (DOCS / "serve-agent.md").read_text()


def test_every_setting_a_request_may_send_belongs_to_a_policy_and_back():
    taken = {setting.name for entry in POLICIES.values() for setting in entry.settings}
    assert taken == set(SETTINGS) == set(Policy.model_fields) - {"name"}


def test_a_new_policy_is_one_entry(monkeypatch):
    """Checked, offered, built and documented from its entry alone."""
    early = StopPolicy(
        "early",
        "stop before any search",
        lambda policy, loaded: (CapController(0), "early"),
        (Setting("k", note="ignored"),),
    )
    monkeypatch.setattr(policies, "POLICIES", {**POLICIES, "early": early})
    check_policy(Policy(name="early", k=3))
    with pytest.raises(ApiError, match="policy early takes no theta_p"):
        check_policy(Policy(name="early", theta_p=0.1))
    book = PolicyBook(STOPPING)
    assert book.offered() == ["natural", "cap", "early"]
    controller, label, _ = book.controller(Policy(name="early"))
    assert isinstance(controller, CapController) and controller.k == 0 and label == "early"
    assert "| `early` | `k` (ignored) | stop before any search | |" in policy_table()


def test_a_policy_needing_a_load_is_offered_once_loaded(monkeypatch):
    needy = replace(POLICIES["natural"], name="needy", needs="stoprag", loads="a Q-network", flag="--stoprag PATH")
    monkeypatch.setattr(policies, "POLICIES", {**POLICIES, "needy": needy})
    with pytest.raises(ApiError) as caught:
        PolicyBook(STOPPING).controller(Policy(name="needy"))
    assert caught.value.status == 400 and caught.value.detail == (
        "policy needy needs a Q-network (start the server with --stoprag PATH), which this server has not loaded"
    )
    assert PolicyBook(STOPPING, stoprag=object()).offered() == ["natural", "cap", "stoprag", "needy"]
