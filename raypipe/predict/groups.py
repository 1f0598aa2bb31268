"""Signal families the head reads (the paper's Table 3 rows) and the unsupervised sources (Table 4).

- unsup: training-free signals from ``features/`` (raypipe.core.schema.FEATURE_COLUMNS), in three sources:
  intra (retrieval quality of the current list), inter (change from earlier iterations), alignment
  (current iteration vs the original question / first reasoning).
  ``seed`` = the nine signals of the seed code's head; ``all`` = every FEATURES signal.
- prob: probe confidence and its change from the previous probe.
- sup: the six cross-encoder predictions (3 relations x 2 targets), all used for both targets, as the
  seed code does.
"""

from __future__ import annotations

from raypipe.predict.relations import RELATIONS, SHORT, TARGETS

UNSUP_SOURCES = {
    "seed": {
        "intra": ["nqc_seed", "a_pair_ratio", "dense_qpp"],
        "inter": ["rbo_prevmax_3", "rbo_prevmax_20", "sim_reasoning_prev"],
        "alignment": ["rbo_question_3", "rbo_question_20", "sim_question_query"],
    },
    "all": {
        "intra": ["nqc_seed", "nqc_shtok", "a_pair_ratio", "dense_qpp"],
        "inter": [
            *(f"{v}_{rel}_{d}" for v in ("rbo", "rbo_ext") for rel in ("prev", "prevmax") for d in (3, 20)),
            "sim_reasoning_prev",
        ],
        "alignment": [
            *(f"{v}_question_{d}" for v in ("rbo", "rbo_ext") for d in (3, 20)),
            "sim_question_query",
            "sim_reasoning_first",
        ],
    },
}
PROB_COLUMNS = {
    "seed": ["probe_conf", "probe_conf_delta"],
    "all": ["probe_conf", "probe_conf_delta", "probe_conf_full", "probe_conf_full_delta"],
}


def sup_column(relation: str, target: str) -> str:
    """Column of one cross-encoder's prediction, e.g. sup_p_at (target p/u, relation short name)."""
    return f"sup_{target}_{SHORT[relation]}"


def sup_columns(relations=RELATIONS) -> list[str]:
    return [sup_column(rel, t) for t in TARGETS for rel in relations]


def family_columns(family: str, unsup: str = "seed", relations=RELATIONS) -> list[str]:
    if family == "unsup":
        return [c for cols in UNSUP_SOURCES[unsup].values() for c in cols]
    if family == "prob":
        return list(PROB_COLUMNS[unsup])
    if family == "sup":
        return sup_columns(relations)
    raise ValueError(f"unknown signal family {family!r}: unsup, sup or prob")


def group_columns(group: str, unsup: str = "seed", relations=RELATIONS) -> list[str]:
    """Columns of a '+'-joined group, e.g. 'unsup+sup+prob', in family order."""
    columns: list[str] = []
    for family in group.split("+"):
        columns += [c for c in family_columns(family, unsup, relations) if c not in columns]
    return columns


def ablation_groups(unsup: str = "seed") -> dict[str, list[str]]:
    """Table 4 rows: each unsupervised source alone, then all of them."""
    sources = UNSUP_SOURCES[unsup]
    rows = {name: list(cols) for name, cols in sources.items()}
    rows["all"] = [c for cols in sources.values() for c in cols]
    return rows
