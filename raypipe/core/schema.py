"""Column names and pyarrow schemas of every Parquet table in a run directory.

These schemas are the contract between stages: every table is keyed by ``qid`` (and ``iteration``
where it has one). A stage writes exactly its schema; later stages add tables, never columns to
earlier ones.
"""

from __future__ import annotations

import pyarrow as pa

# Stop reasons recorded in trajectories.stop_reason.
STOP_ANSWER = "answer"  # the model gave its own answer
STOP_MAX_TURNS = "max_turns"  # turn limit reached: no final answer (agent.at_limit=forced: a forced one)
STOP_NO_RESULTS = "no_results"  # a search returned no documents (pyterrier-rag: "No retrieval results")
STOP_NO_ACTION = "no_valid_action"  # the model emitted neither a search nor an answer
STOP_CONTEXT = "context_overflow"  # the context outgrew the model's window
STOP_ENGINE_ERROR = "engine_error"  # the engine could not be reached or did not answer (an outage)
STOP_ENGINE_CRASH = "engine_crash"  # in flight at generation.max_question_crashes engine deaths, then killed it alone
STOP_RETRIEVAL_ERROR = "retrieval_error"  # the retrieval service failed on this row (an outage)
STOP_QUERY_CRASH = (
    "query_crash"  # its query killed a retrieval replica even when searched alone (retrieval.actors.max_query_crashes)
)
# A failure that a rerun would repeat and that is neither the model's nor retrieval's: a bug in the loop or
# its controller, a prompt that cannot be built, a request the engine refuses (deterministic under greedy decoding)
STOP_INTERNAL_ERROR = "internal_error"
STOP_CONTROLLER = "controller"  # an online stopping controller ended the trajectory
# Reasons that name an outage (the retrieval server, an engine's HTTP server), not the question: a rerun
# retries them by default (generation.retry_transient). engine_crash, query_crash, internal_error,
# context_overflow and the rest are the question's own and stay.
TRANSIENT_STOP_REASONS = (STOP_ENGINE_ERROR, STOP_RETRIEVAL_ERROR)
STOP_REASONS = (
    STOP_ANSWER,
    STOP_MAX_TURNS,
    STOP_NO_ACTION,
    STOP_CONTEXT,
    STOP_ENGINE_ERROR,
    STOP_ENGINE_CRASH,
    STOP_RETRIEVAL_ERROR,
    STOP_QUERY_CRASH,
    STOP_INTERNAL_ERROR,
    STOP_CONTROLLER,
    STOP_NO_RESULTS,
)

# Cost of one iteration: what its turn did -- the turn's generation, its probe, the search the turn issued
# (whose documents the next row holds; a search the online controller made moot is still counted here,
# with search_dropped set) and a forced answer. Token counts come from the engine; a column is null where
# the backend does not report it (cached_tokens on a server without prompt-token details; queue_s /
# engine_s on the HTTP backend). prefilled_tokens = prompt_tokens - cached_tokens. Times are seconds
# summed over the iteration's requests (concurrent requests overlap, so they add up to more than wall time).
ITERATION_COSTS = [
    pa.field("prompt_tokens", pa.int32()),  # prompt tokens of the iteration's requests (turn + probe + forced answer)
    pa.field("cached_tokens", pa.int32()),  # of which served from the prefix cache
    pa.field("prefilled_tokens", pa.int32()),  # of which computed: prompt_tokens - cached_tokens
    pa.field("probe_prompt_tokens", pa.int32()),  # the probe's share of prompt_tokens
    pa.field("probe_cached_tokens", pa.int32()),  # the probe's share of cached_tokens
    pa.field("retrieval_s", pa.float32()),  # the search this turn issued, as the agent waited for it
    pa.field("search_dropped", pa.bool_()),  # that search ran but the controller stopped before it was read
    pa.field("queue_s", pa.float32()),  # requests waiting in the engine's queue
    pa.field("engine_s", pa.float32()),  # requests from first scheduled to last token (prefill + decode)
    # the online controller's decision on this iteration, as the trajectory waited for it (with its wait for a
    # batched prediction); null where no controller runs
    pa.field("decision_s", pa.float32()),
]
COST_COLUMNS = tuple(f.name for f in ITERATION_COSTS)
# Columns that depend on timing and scheduling, not on the results: times, and prefix-cache hits (a rerun or
# another placement starts with an empty cache). Left out when two runs' tables are compared for equality.
SCHEDULING_COLUMNS = (
    "wall_s",
    "retrieval_s",
    "queue_s",
    "engine_s",
    "decision_s",
    "cached_tokens",
    "prefilled_tokens",
    "probe_cached_tokens",
)
# trajectories/ holds each cost column summed over the trajectory's iterations (search_dropped as a count;
# decision_s only in iterations/, so a run without a controller writes the trajectories it always did).
TRAJECTORY_COSTS = [
    *(f for f in ITERATION_COSTS if f.name not in ("search_dropped", "decision_s")),
    pa.field("searches_dropped", pa.int32()),  # searches the controller made moot
]

ITERATIONS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),  # 0 = the probe before any retrieval
        pa.field("query", pa.string()),  # null at iteration 0
        pa.field("doc_ids", pa.list_(pa.string())),  # deep list (deep_k) for QPP; the agent saw the top_k
        pa.field("doc_scores", pa.list_(pa.float32())),
        pa.field("reasoning", pa.string()),  # the model's text for this iteration
        pa.field("probe_answer", pa.string()),
        pa.field("probe_token_logprobs", pa.list_(pa.float32())),
        pa.field("probe_f1", pa.float32()),  # P_i
        pa.field("utility", pa.float32()),  # U_i = P_i - P_{i-1}; null at 0
        pa.field("tokens_generated", pa.int32()),  # by the agent in this iteration (probes excluded)
        pa.field("probe_tokens", pa.int32()),  # generated by this iteration's probe
        *ITERATION_COSTS,
    ]
)

TRAJECTORIES = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("golden_answers", pa.list_(pa.string()), nullable=False),
        pa.field("final_answer", pa.string()),
        pa.field("final_f1", pa.float32()),
        pa.field("n_iterations", pa.int32()),  # retrieval iterations performed
        pa.field("stop_reason", pa.string(), nullable=False),
        pa.field("error", pa.string()),  # message when stop_reason is an error
        pa.field("tokens_generated", pa.int32()),  # agent tokens, probes excluded
        pa.field("probe_tokens", pa.int32()),
        pa.field("wall_s", pa.float32()),
        pa.field("transcript", pa.string()),  # the whole generated context after the prompt
        *TRAJECTORY_COSTS,
    ]
)

# Predicted P_i / U_i (jobs/train.py), one row per qid x retrieval iteration (iteration >= 1; iteration 0
# has no retrieval and no U). Predictions are out of fold: `fold` names the k-fold split whose models
# (cross-encoders and head) never saw this question. p_hat/u_hat at iteration i use only iterations <= i,
# so they are what an online controller would have seen. `predictions` holds the chosen head
# configuration; `prediction_grid` the same columns for every feature group x window evaluated.
PREDICTIONS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("fold", pa.int32(), nullable=False),
        pa.field("feature_group", pa.string(), nullable=False),  # e.g. "unsup+sup+prob"
        pa.field("window", pa.int32(), nullable=False),  # w: iterations the head sees (current + w-1 previous)
        pa.field("p_hat", pa.float32()),  # predicted P_i
        pa.field("u_hat", pa.float32()),  # predicted U_i
        pa.field("probe_f1", pa.float32()),  # target P_i (copied from iterations)
        pa.field("utility", pa.float32()),  # target U_i
    ]
)

# Trajectory signals (jobs/features.py), one row per qid x iteration. Definitions: raypipe/features/.
# Every signal is null where it is undefined: at iteration 0 (no query, no list), with no previous
# iteration, an empty retrieval list, missing text, or too few probe tokens.
# RBO columns: rbo_* = PyTerrier-alpha's truncated RBO (the seed paper's), rbo_ext_* = Webber's
# extrapolated RBO; _3 / _20 = depth; prev = vs the previous iteration's list, prevmax = max over all
# earlier lists, question = vs the original question's own retrieval list (topic drift).
RBO_DEPTHS = (3, 20)
RBO_COLUMNS = tuple(
    f"{variant}_{relation}_{depth}"
    for variant in ("rbo", "rbo_ext")
    for relation in ("prev", "prevmax", "question")
    for depth in RBO_DEPTHS
)
FEATURE_COLUMNS = (
    "nqc_seed",  # var(top-100 scores) x max_t log(N/df_t): the seed paper's "NQC"
    "nqc_shtok",  # std(top-k scores) / |mean score of the deep list|: textbook NQC, corpus score surrogate
    "a_pair_ratio",  # pairwise document coherence over the top 50, as the seed code computes it
    "dense_qpp",  # semantic concentration of the query and top-3 document vectors (index encoder)
    *RBO_COLUMNS,
    "sim_question_query",  # SBERT cosine(question, q_i)
    "sim_reasoning_prev",  # SBERT cosine(r_{i-1}, r_i)
    "sim_reasoning_first",  # SBERT cosine(r_0, r_i), i >= 1
    "probe_conf",  # mean probe token logprob without the last 4 tokens (seed paper)
    "probe_conf_full",  # mean over all probe tokens
    "probe_conf_delta",  # probe_conf_i - probe_conf_{i-1}
    "probe_conf_full_delta",
)
FEATURES = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("probe_f1", pa.float32()),  # P_i, carried from iterations
        pa.field("utility", pa.float32()),  # U_i, carried from iterations
        *(pa.field(name, pa.float64()) for name in FEATURE_COLUMNS),
    ]
)

# Out-of-fold cross-encoder predictions (jobs/train.py), one row per qid x iteration >= 1: the "sup" signal
# family, sup_<target p|u>_<relation at|ld|ii>, each from a model that never saw the question (null when
# that relation was not trained). With features/ they let other heads be fit without the cross-encoders.
SUP_COLUMNS = tuple(f"sup_{t}_{r}" for t in ("p", "u") for r in ("at", "ld", "ii"))
SUP_SIGNALS = pa.schema(
    [
        pa.field("qid", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("fold", pa.int32(), nullable=False),  # the cross-encoders' question fold
        *(pa.field(name, pa.float64()) for name in SUP_COLUMNS),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "iterations": ITERATIONS,
    "trajectories": TRAJECTORIES,
    "predictions": PREDICTIONS,
    "prediction_grid": PREDICTIONS,
    "features": FEATURES,
    "sup_signals": SUP_SIGNALS,
}


def empty_table(name: str) -> pa.Table:
    return TABLES[name].empty_table()


# Columns a row may leave out (they are then null): the cost columns, which hand-built tables and run
# directories written before they existed lack.
OPTIONAL_COLUMNS: dict[str, frozenset[str]] = {
    "iterations": frozenset(COST_COLUMNS),
    "trajectories": frozenset(f.name for f in TRAJECTORY_COSTS),
}


def conform(rows: list[dict], name: str) -> pa.Table:
    """Build a table of ``name``'s schema from row dicts; a missing (not optional) or extra column, or a
    trajectory's stop_reason outside :data:`STOP_REASONS`, is an error."""
    schema = TABLES[name]
    expected, optional = set(schema.names), OPTIONAL_COLUMNS.get(name, frozenset())
    for row in rows:
        missing, extra = expected - set(row) - optional, set(row) - expected
        if missing or extra:
            raise ValueError(f"{name} row for qid {row.get('qid')!r}: missing {sorted(missing)}, extra {sorted(extra)}")
        if name == "trajectories" and row["stop_reason"] not in STOP_REASONS:
            raise ValueError(f"trajectories row for qid {row.get('qid')!r}: unknown stop_reason {row['stop_reason']!r}")
    return pa.Table.from_pylist(rows, schema=schema)
