"""The seed paper's setup, one described table: what the report's "Setup" panel compares a run against.

"Predicting Partial Answer Quality and Utility in Agentic RAG" (Tian, Ganguly, Macdonald; code:
DanielTian97/agentic_rag_predictions) and, for the Stop-RAG comparison, Stop-RAG (Park, Cho, Lee; code:
chosolbee/MHQA-SetVerify). Each :class:`SeedSetting` names a config key (dotted, as ``--set`` takes it;
``effective.*`` keys are values the report resolves, e.g. the top-k a protocol defaults to), the seed's
value (per agent protocol where the two agents differ), or a test with its description where a run may
match in more than one way (a model path), and where the value comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Check = Callable[[Any], bool]


@dataclass(frozen=True)
class SeedSetting:
    area: str  # agent, retrieval, training protocol, cross-encoders, head, stopping, Stop-RAG
    key: str
    value: Any = None  # the seed's value (equality), or {protocol: value}
    source: str = ""
    check: Check | None = None  # instead of equality; ``value`` then describes what passes
    per_protocol: bool = False

    def seed_value(self, protocol: str) -> Any:
        return self.value[protocol] if self.per_protocol else self.value

    def matches(self, run_value: Any, protocol: str) -> bool:
        if self.check is not None:
            return bool(self.check(run_value))
        seed = self.seed_value(protocol)
        if isinstance(seed, (list, tuple)) and isinstance(run_value, (list, tuple)):
            return list(seed) == list(run_value)
        return run_value == seed


def _contains(*needles: str) -> Check:
    return lambda v: v is not None and all(n in str(v).lower() for n in needles)


def _datasets(value: Any) -> bool:
    names = " ".join(str(v).lower() for v in (value or []))
    return all(n in names for n in ("hotpotqa", "2wiki", "musique"))


PYTERRIER = "pyterrier-rag 0.3.0 frameworks/agentic (_searchr1.py, _r1searcher.py, _base.py)"
PROBING = "probing/run_probing.py, probing/agents.py"
SUPERVISED = "predictions/supervised/train.py, relations.py, data.py"
HEAD = "predictions/prediction_head/mlp.py, train.py, sequential.py"
STOPRAG = "chosolbee/MHQA-SetVerify Training/multihead_stop_decider_train.py, compute_metrics.py"

SEED_SETUP: tuple[SeedSetting, ...] = (
    SeedSetting(
        "agent", "engine.model", "a Qwen2.5-7B Search-R1 / R1-Searcher checkpoint", "the paper's setup", _contains("7b")
    ),
    SeedSetting("agent", "agent.observation_format", "pyterrier", PYTERRIER),
    SeedSetting("agent", "effective.max_turns", 10, f"{PYTERRIER}: max_turn=10"),
    SeedSetting("agent", "agent.temperature", {"search_r1": 0.7, "r1_searcher": 0.0}, PROBING, per_protocol=True),
    SeedSetting("agent", "agent.max_new_tokens", {"search_r1": 1024, "r1_searcher": 512}, PROBING, per_protocol=True),
    SeedSetting("agent", "agent.enforcement", "none", "the checkpoints follow their protocol"),
    SeedSetting("agent", "agent.probe", True, PROBING),
    SeedSetting(
        "agent",
        "agent.probe_max_tokens",
        {"search_r1": 1024, "r1_searcher": 512},
        f"{PROBING}: probes share the generation's budget",
        per_protocol=True,
    ),
    SeedSetting("agent", "agent.at_limit", "none", f"{PYTERRIER}: no answer at the turn limit"),
    SeedSetting("agent", "agent.metric", "hotpotqa", "pyterrier-rag's F1 (the HotpotQA rule)"),
    SeedSetting("retrieval", "data.datasets", "HotpotQA, 2WikiMultihopQA and MuSiQue", "the paper's setup", _datasets),
    SeedSetting(
        "retrieval",
        "data.corpus",
        "the 2018 Wikipedia dump (wiki-18, FlashRAG)",
        "the paper's setup",
        lambda v: _contains("wiki")(v) and _contains("18")(v),
    ),
    SeedSetting("retrieval", "retrieval.encoder", "E5 (e5-base-v2)", "the paper's setup", _contains("e5-base-v2")),
    SeedSetting("retrieval", "retrieval.index.type", "flat", "Search-R1's e5_Flat.index"),
    SeedSetting("retrieval", "effective.top_k", 3, f"{PROBING}: top_k=3 for both agents"),
    SeedSetting(
        "retrieval",
        "retrieval.deep_k",
        "at least 100",
        "predictions/unsupervised (NQC over the top 100)",
        lambda v: v is not None and v >= 100,
    ),
    SeedSetting(
        "training protocol",
        "train_run",
        "a training run: trained on the training splits, evaluated on dev",
        "paper §5.3",
        lambda v: bool(v),
    ),
    SeedSetting("cross-encoders", "train.base_model", "minilm", f"{SUPERVISED}: all-MiniLM-L6-v2"),
    SeedSetting(
        "cross-encoders", "train.relations", ["adjacent_think", "long_distance", "intra_iteration"], SUPERVISED
    ),
    SeedSetting("cross-encoders", "train.learning_rate", 2e-5, SUPERVISED),
    SeedSetting("cross-encoders", "train.epochs", 3, SUPERVISED),
    SeedSetting("cross-encoders", "train.effective_batch_size", 256, SUPERVISED),
    SeedSetting("cross-encoders", "train.weight_decay", 0.0, SUPERVISED),
    SeedSetting("cross-encoders", "train.dropout", 0.0, SUPERVISED),
    SeedSetting("cross-encoders", "train.field_chars", 256, SUPERVISED),
    SeedSetting("cross-encoders", "train.title_chars", 128, SUPERVISED),
    SeedSetting(
        "cross-encoders",
        "train.max_tokens",
        "1024 (MiniLM reads 512; the cut fields fit)",
        SUPERVISED,
        lambda v: v is not None and v >= 512,
    ),
    SeedSetting("head", "train.head", "seed", HEAD),
    SeedSetting("head", "train.head_input", "seed", HEAD),
    SeedSetting("head", "train.include_type", True, HEAD),
    SeedSetting("head", "train.window_slots", "previous", "the paper's text (the public sequential.py: seed_public)"),
    SeedSetting("head", "train.windows", "1, 3 and 5", "paper Table 3", lambda v: {1, 3, 5} <= set(v or [])),
    SeedSetting("head", "train.unsup_columns", "seed", "predictions/prediction_head/features.py"),
    SeedSetting("head", "train.head_hidden", [16, 8], HEAD),
    SeedSetting("head", "train.head_weight_decay", 1e-3, HEAD),
    SeedSetting("head", "train.head_learning_rate", 1e-3, HEAD),
    SeedSetting("head", "train.head_batch_size", 256, HEAD),
    SeedSetting("head", "train.head_max_iter", 300, HEAD),
    SeedSetting("head", "train.head_patience", 15, HEAD),
    SeedSetting("head", "train.head_validation_fraction", 0.1, HEAD),
    SeedSetting("head", "train.significance", 0.05, "paper §5.3: Fisher's z, p < 0.05"),
    SeedSetting("stopping", "stopping.theta_p", 0.3, "the paper's operating point"),
    SeedSetting("stopping", "stopping.theta_u", 0.2, "the paper's operating point"),
    SeedSetting("stopping", "stopping.variant", "paper", "control/joint_controller.py"),
    SeedSetting("Stop-RAG", "stoprag.encoder", "DeBERTa-v3-large", STOPRAG, _contains("deberta-v3-large")),
    SeedSetting("Stop-RAG", "stoprag.max_length", 2048, STOPRAG),
    SeedSetting("Stop-RAG", "stoprag.target", "qlambda", "the Stop-RAG paper"),
    SeedSetting("Stop-RAG", "stoprag.lambda_start", 1.0, STOPRAG),
    SeedSetting("Stop-RAG", "stoprag.lambda_end", 0.1, STOPRAG),
    SeedSetting("Stop-RAG", "stoprag.reward_samples", 8, f"{STOPRAG}: --repeat-size 8"),
    SeedSetting(
        "Stop-RAG", "stoprag.threshold_objective", "reward", "Stop-RAG paper: the threshold tuned on validation"
    ),
)
