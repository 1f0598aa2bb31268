"""The stopping policies a served trajectory may run under, in one registry (:data:`POLICIES`): each policy's name,
the request settings it takes (those it needs, the values a setting may hold), what the server must have loaded
to offer it, how its controller is built, and its line in docs/serve-agent.md's table (:func:`policy_table`, which
a test holds the docs to). Adding a policy is one :class:`StopPolicy` entry. The probe job's ``--controller``
builds its heuristic here too (:func:`controller_on_bundle`).

A request names its policy in :class:`~raypipe.agents.answer_api.Policy` (the wire format: every setting's type);
:func:`check_policy` refuses what the policy does not take (:class:`~raypipe.agents.answer_api.ApiError`, 400 or
422), and :func:`build_controller` turns it into the trajectory's controller and the label answers carry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from raypipe.agents.answer_api import ApiError, Policy
from raypipe.agents.hooks import StopController
from raypipe.core.config import (
    PAPER_THETA_P,
    PAPER_THETA_U,
    PAPER_THETA_U_STRICT,
    HeuristicVariant,
    RunConfig,
    StoppingConfig,
)
from raypipe.stopping.cap_online import CapController
from raypipe.stopping.heuristic import VARIANTS, Thresholds
from raypipe.stopping.online import OnlineController, PredictionSource, bundle_folder, bundle_predictions

# Named (θ_P, θ_U) pairs a heuristic policy may ask for; without a preset or thetas: the server's stopping.theta_*.
THRESHOLD_PRESETS = {"paper": (PAPER_THETA_P, PAPER_THETA_U), "paper_strict": (PAPER_THETA_P, PAPER_THETA_U_STRICT)}
VARIANT_NAMES = get_args(HeuristicVariant)


@dataclass(frozen=True)
class Setting:
    """A setting a policy takes: ``required`` says what it is when the request leaves it out (a 422), ``choices``
    the names it may hold, ``note`` what the docs' table adds."""

    name: str
    required: str | None = None
    choices: Sequence[str] | None = None
    note: str = ""

    def doc(self) -> str:
        return f"`{self.name}`" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Loaded:
    """What a request's controller may be built from: the server's ``stopping`` defaults, the heuristic's
    predictions for this request (``--controller``) and the Stop-RAG controller (``--stoprag``), None where not
    loaded."""

    stopping: StoppingConfig
    predictor: PredictionSource | None = None
    stoprag: StopController | None = None


@dataclass(frozen=True)
class StopPolicy:
    """One policy. ``build(policy, loaded)``: its controller (None: the agent runs to its own end) and its label as
    run; ``needs``: the :class:`Loaded` field it cannot run without, ``loads`` what that is and ``flag`` the server
    flag that loads it."""

    name: str
    what: str
    build: Callable[[Policy, Loaded], tuple[StopController | None, str]]
    settings: tuple[Setting, ...] = ()
    needs: str | None = None
    loads: str = ""
    flag: str = ""
    takes: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "takes", frozenset(s.name for s in self.settings))


def _heuristic(policy: Policy, loaded: Loaded) -> tuple[StopController, str]:
    stopping = loaded.stopping
    default = (stopping.theta_p, stopping.theta_u)
    theta_p, theta_u = default if policy.preset is None else THRESHOLD_PRESETS.get(policy.preset, default)
    thresholds = Thresholds(
        theta_p if policy.theta_p is None else policy.theta_p, theta_u if policy.theta_u is None else policy.theta_u
    )
    variant = policy.variant or stopping.variant
    predictor = loaded.predictor
    assert predictor is not None  # build_controller checked that the server offers the policy (check_offered)
    controller = OnlineController(None, thresholds, VARIANTS[variant], source=predictor)
    return controller, f"heuristic(theta_p={thresholds.theta_p:g}, theta_u={thresholds.theta_u:g}, {variant})"


def _cap(policy: Policy, loaded: Loaded) -> tuple[StopController, str]:
    assert policy.k is not None  # a required setting: check_policy answers a request without it with a 422
    return CapController(policy.k), f"cap{policy.k}"


_PRESETS_NOTE = ", ".join(f"`{name}`: {p:g}/{u:g}" for name, (p, u) in THRESHOLD_PRESETS.items())

POLICIES: dict[str, StopPolicy] = {
    p.name: p
    for p in (
        StopPolicy("natural", "the agent runs to its own end", lambda policy, loaded: (None, "natural")),
        StopPolicy(
            "heuristic",
            "the seed paper's 4-state heuristic with rollback on the bundle's P̂/Û (`raypipe/stopping/online.py`); "
            "without settings the server's `stopping.theta_p`/`theta_u`/`variant`; a preset's pair, then "
            "`theta_p`/`theta_u` override it",
            _heuristic,
            (
                Setting("theta_p"),
                Setting("theta_u"),
                Setting("preset", choices=tuple(THRESHOLD_PRESETS), note=_PRESETS_NOTE),
                Setting("variant", choices=VARIANT_NAMES, note=", ".join(f"`{v}`" for v in VARIANT_NAMES)),
            ),
            needs="predictor",
            loads="a predictor bundle",
            flag="--controller BUNDLE",
        ),
        StopPolicy(
            "cap",
            "Cap@k: stop after retrieval iteration k with that iteration's probe (`k = 0`: before any search)",
            _cap,
            (
                Setting(
                    "k",
                    required="the retrieval iterations it allows (0: answer before any search)",
                    note="required, >= 0",
                ),
            ),
        ),
        StopPolicy(
            "stoprag",
            "Stop-RAG's Q-network with its tuned threshold (`raypipe/stoprag/qnet.py`)",
            lambda policy, loaded: (loaded.stoprag, "stoprag"),
            needs="stoprag",
            loads="a Stop-RAG Q-network",
            flag="--stoprag PATH",
        ),
    )
}
SETTINGS = tuple(name for name in Policy.model_fields if name != "name")  # what a request's policy may set


def check_policy(policy: Policy) -> None:
    """A 400 for an unknown policy, a 422 for a setting it does not take, a required one left out or a name outside
    a setting's choices."""
    entry = POLICIES.get(policy.name)
    if entry is None:
        raise ApiError(400, f"unknown policy {policy.name!r}: this server knows {', '.join(POLICIES)}")
    given = {name for name in SETTINGS if getattr(policy, name) is not None}
    if given - entry.takes:
        raise ApiError(
            422,
            f"policy {policy.name} takes no {', '.join(sorted(given - entry.takes))}"
            + (f" (it takes {', '.join(sorted(entry.takes))})" if entry.takes else ""),
        )
    for setting in entry.settings:
        value = getattr(policy, setting.name)
        if value is None and setting.required:
            raise ApiError(422, f"policy {policy.name} needs {setting.name}: {setting.required}")
        if value is not None and setting.choices is not None and value not in setting.choices:
            raise ApiError(422, f"unknown {setting.name} {value!r}: one of {', '.join(setting.choices)}")


def offered(loaded: Loaded) -> list[str]:
    """The policies a server with ``loaded`` offers: those that need nothing first, then those whose load is there."""
    ready = [p for p in POLICIES.values() if p.needs is None or getattr(loaded, p.needs) is not None]
    return [p.name for p in sorted(ready, key=lambda p: p.needs is not None)]


def check_offered(policy: Policy, loaded: Loaded) -> None:
    """A 400 for a policy this server does not offer (what it needs not loaded, or no such policy)."""
    if policy.name not in offered(loaded):
        entry = POLICIES.get(policy.name)
        raise ApiError(
            400,
            f"policy {policy.name} needs {entry.loads} (start the server with {entry.flag}), which "
            "this server has not loaded"
            if entry
            else f"unknown policy {policy.name!r}",
        )


def build_controller(policy: Policy, loaded: Loaded) -> tuple[StopController | None, str]:
    """The controller of one request's policy (checked with :func:`check_offered` first) and the policy as run."""
    check_offered(policy, loaded)
    return POLICIES[policy.name].build(policy, loaded)


def controller_on_bundle(path: str | Path, config: RunConfig) -> StopController:
    """The probe job's ``--controller PATH``: the registry's ``heuristic`` policy with the server defaults of
    ``config.stopping`` (theta_p, theta_u, variant: ``--set stopping.theta_p=...``), on the predictor bundle PATH
    names (a bundle folder or a run directory with one under ``models/``; FileNotFoundError otherwise), loaded in
    each generation actor on its first decision."""
    loaded = Loaded(config.stopping, predictor=bundle_predictions(bundle_folder(path), config))
    controller, _ = build_controller(Policy(name="heuristic"), loaded)
    assert controller is not None  # the heuristic always stops by a controller
    return controller


def policy_table() -> str:
    """docs/serve-agent.md's table of the policies (a test holds the docs to it)."""
    rows = ["| `name` | settings | what | needs |", "|---|---|---|---|"]
    for p in POLICIES.values():
        cells = [f"`{p.name}`", ", ".join(s.doc() for s in p.settings), p.what, f"`{p.flag}`" if p.flag else ""]
        rows.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    return "\n".join(rows)
