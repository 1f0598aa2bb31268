"""Shared-storage pre-flight: before a stage's work, every node that will read or write a folder sees it.

On a cluster whose head runs no work, a run directory on the head's local disk (or an index folder mounted
on no retrieval node) fails late and far from its cause: a Ray Data task on a worker writes into its own
node's empty folder, or a retrieval replica finds no index. :func:`check_shared_storage` finds this at the
stage's start: when the Ray cluster has more than one alive node, the driver writes a marker file into each
folder (or, for a folder read only, names a file that must be there), runs a zero-CPU task pinned to each node
that must see it (``NodeAffinitySchedulingStrategy(soft=False)``, a bounded wait) and raises
:class:`SharedStorageError` with one line naming the path, the first node that does not see it (its IP and
resources, i.e. its node type) and the setting to change (docs/cluster.md, "Shared storage"). A single-node
Ray pays one ``ray.nodes()`` call.

The decision logic (:func:`nodes_with`, :func:`describe_node`, :func:`missing_line`) is plain Python over
``ray.nodes()`` records; only :func:`check_shared_storage` and :func:`alive_nodes` touch Ray.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ANSWER_TIMEOUT_S = 120.0  # a zero-CPU task's answer from every node (a worker process may have to start first)
MARKER_PREFIX = ".raypipe-shared-"
HEAD_RESOURCE = "node:__internal_head__"
HIDDEN_RESOURCES = ("memory", "object_store_memory")  # shown nowhere: every node has them


class SharedStorageError(RuntimeError):
    """A folder the stage needs on several nodes is not visible on one of them (one line)."""


@dataclass(frozen=True)
class SharedPath:
    """A folder some nodes must see: ``what`` names it in the message, ``setting`` is what the user changes.

    ``expect``: a file that must already be in the folder (a folder read only, e.g. an index's
    ``manifest.json``); None: the driver writes a marker there (a folder the stage writes).
    ``demand``: the resources a node must have to need the folder (e.g. the retrieval actors'); empty: every node.
    """

    what: str
    path: Path
    setting: str
    expect: str | None = None
    demand: Mapping[str, float] = field(default_factory=dict)


def nodes_with(nodes: Sequence[Mapping], demand: Mapping[str, float]) -> list[Mapping]:
    """The alive nodes of ``ray.nodes()`` records whose total resources cover ``demand`` (all alive ones when
    ``demand`` is empty or asks for nothing)."""
    return [
        n
        for n in nodes
        if n.get("Alive")
        and all(n.get("Resources", {}).get(name, 0) >= amount for name, amount in demand.items() if amount > 0)
    ]


def describe_node(node: Mapping) -> str:
    """``127.0.0.1 (GPU 2, raypipe_generation 2, CPU 4)``: the node's IP and its resources, which name its
    node type; ``head`` marks the head node."""
    resources = node.get("Resources", {})
    shown = [
        f"{name} {amount:g}"
        for name, amount in sorted(resources.items())
        if not name.startswith("node:") and name not in HIDDEN_RESOURCES and not name.startswith("accelerator_type:")
    ]
    role = "head, " if HEAD_RESOURCE in resources else ""
    return f"{node.get('NodeManagerAddress', '?')} ({role}{', '.join(shown) or 'no resources'})"


def missing_line(shared: SharedPath, blind: Sequence[Mapping], checked: int) -> str:
    """The one line for ``shared`` not being visible on the ``blind`` nodes (of ``checked``)."""
    others = f" and {len(blind) - 1} more of the {checked} nodes checked" if len(blind) > 1 else ""
    target = f"{shared.path / shared.expect}" if shared.expect else f"{shared.path}"
    return (
        f"{shared.what} {target} is not visible from node {describe_node(blind[0])}{others}: put it on storage every "
        f"node mounts (a shared POSIX mount) and set {shared.setting} to a path there (docs/cluster.md, 'Shared "
        "storage')"
    )


def alive_nodes() -> list[dict]:
    """The alive nodes of the connected Ray cluster (none when this process has not joined one)."""
    import ray

    if not ray.is_initialized():
        return []
    return [n for n in ray.nodes() if n.get("Alive")]


def check_shared_storage(
    paths: Sequence[SharedPath], nodes: Sequence[Mapping] | None = None, timeout_s: float = ANSWER_TIMEOUT_S
) -> None:
    """Raise :class:`SharedStorageError` when a node that needs one of ``paths`` does not see it (module
    docstring); nothing to do on a single-node Ray. ``nodes``: ``ray.nodes()`` records (default: the alive ones)."""
    nodes = alive_nodes() if nodes is None else [n for n in nodes if n.get("Alive")]
    if len(nodes) <= 1:
        return
    for shared in paths:
        targets = nodes_with(nodes, shared.demand)
        if not targets:
            continue
        if shared.expect:
            _check(shared, targets, shared.path / shared.expect, None, timeout_s)
            continue
        shared.path.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        marker = shared.path / f"{MARKER_PREFIX}{token}"
        marker.write_text(token)
        try:
            _check(shared, targets, marker, token, timeout_s)
        finally:
            marker.unlink(missing_ok=True)


def _check(shared: SharedPath, targets: list[Mapping], path: Path, token: str | None, timeout_s: float) -> None:
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_sees)
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(path), token
        )
        for n in targets
    ]
    try:
        answers = ray.get(refs, timeout=timeout_s)
    except GetTimeoutError:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        silent = [n for n, ref in zip(targets, refs) if ref not in ready]
        for ref in refs:
            ray.cancel(ref, force=True)
        raise SharedStorageError(
            f"checking that {shared.what} {shared.path} is visible on every node: node {describe_node(silent[0])} "
            f"did not answer within {timeout_s:.0f} s (is it out of memory or unreachable?)"
        ) from None
    blind = [n for n, seen in zip(targets, answers) if not seen]
    if blind:
        raise SharedStorageError(missing_line(shared, blind, len(targets)))


def _sees(path: str, token: str | None) -> bool:
    """On a node: whether ``path`` exists there (and holds ``token`` when given)."""
    try:
        return os.path.exists(path) if token is None else Path(path).read_text() == token
    except OSError:
        return False
