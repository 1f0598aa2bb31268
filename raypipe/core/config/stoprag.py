"""The ``stoprag`` section: Stop-RAG's value-based controller."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raypipe.core.config.base import PAPER_F1_SHARE, StrictModel


class StopRagConfig(StrictModel):
    """Stop-RAG (value-based stopping with Q(lambda)) and the LLM-Stop baseline (``jobs/stoprag.py``)."""

    encoder: str = Field(default="minilm", description="Q-network encoder: embedded name or a local HF folder.")
    pooling: Literal["cls", "mean"] = Field(default="cls", description="cls: the public code's encoder-only pooling.")
    dropout: float = Field(default=0.1, ge=0, lt=1)
    max_length: int | None = Field(
        default=None,
        ge=16,
        description="Encoder tokens per state; None: the longest the encoder accepts (reference: 2048).",
    )
    state_truncation: Literal["newest", "start"] = Field(
        default="newest",
        description="newest: drop the oldest document tokens, keep question and newest document; "
        "start: the tokenizer's cut at the end (the reference's call, which loses the newest documents).",
    )
    state_input: Literal["docs", "trace"] = Field(
        default="docs",
        description="docs: question[SEP]title: text[SEP]... (reference --use-docs-only); "
        "trace: + 'Follow up:' queries and 'Intermediate answer:' probes (its full trace).",
    )
    doc_chars: int | None = Field(
        default=None, ge=1, description="Characters kept of each document; None: all (reference)."
    )
    docs_per_iteration: int | None = Field(
        default=1,
        ge=1,
        description="Documents each iteration adds to a state (reference max_docs=1); None: all it saw.",
    )
    reward_source: Literal["probe", "generator"] = Field(
        default="probe",
        description="Answer generator of every state's reward, the terminal one included: probe = the "
        "agent's probed answers; generator = the reference's docs-only final-answer prompt through the engine.",
    )
    reward_samples: int = Field(default=1, ge=1, description="Answers per state, mean F1 (generator only; paper: 8).")
    reward_temperature: float = Field(default=0.0, ge=0, description="Generator temperature (reference default 0.0).")
    reward_max_tokens: int = Field(
        default=400, ge=1, description="Generator answer tokens (reference --fag-max-gen-length)."
    )
    first_decision: int = Field(
        default=1, ge=0, le=1, description="First iteration that may stop (0 = before retrieval)."
    )
    target: Literal["qlambda", "mc", "q0", "binary"] = "qlambda"
    lambda_start: float = Field(default=1.0, ge=0, le=1)
    lambda_end: float = Field(default=0.1, ge=0, le=1)
    drop_no_signal: bool = Field(default=True, description="Drop training states whose rewards are all zero.")
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=16, ge=1, description="Per worker.")
    learning_rate: float = Field(default=5e-5, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    max_grad_norm: float = Field(default=30.0, gt=0)
    num_workers: int = Field(default=2, ge=1, description="Ray Train workers.")
    cpus_per_worker: float = Field(default=1.0, gt=0)
    use_gpu: bool = False
    split: tuple[float, float, float] = Field(default=(0.6, 0.2, 0.2), description="train/val/test shares by qid.")
    split_seed: int = 0
    threshold_objective: Literal["reward", "share"] = Field(
        default="reward", description="reward: best validation F1 (paper); share: fewest iterations at min_share."
    )
    min_share: float = Field(default=PAPER_F1_SHARE, gt=0, le=1.5)
    llm_stop: bool = Field(default=True, description="Evaluate the LLM-Stop baseline (runs the engine).")
    llm_stop_max_questions: int | None = Field(default=40, ge=1, description="Test questions LLM-Stop is run on.")
    llm_stop_max_tokens: int = Field(default=200, ge=1)
    llm_stop_temperature: float = Field(default=0.0, ge=0)
    llm_stop_docs: int = Field(default=1, ge=1, description="Selected documents shown per round (the reference: one).")
    llm_stop_parser: Literal["reference", "tolerant"] = Field(
        default="reference",
        description="reference: stop_decider.py's extract_decision; tolerant: markdown decision "
        "lines, <STOP>/<CONTINUE> tokens only, the default when both appear.",
    )
    llm_stop_default: Literal["stop", "continue"] = Field(
        default="continue",
        description="Decision when the output names neither (reference: continue; tolerant: or both).",
    )
    llm_stop_enforce: bool = Field(
        default=False,
        description="Named option: constrain LLM-Stop's output to 'Analysis: ...' + 'Decision: <STOP>|<CONTINUE>' "
        "(vLLM structured outputs), for small models that never name a decision; off = the public free-text prompt.",
    )

    @model_validator(mode="after")
    def _check_split(self) -> StopRagConfig:
        if any(f < 0 for f in self.split) or abs(sum(self.split) - 1.0) > 1e-6 or min(self.split) == 0:
            raise ValueError(f"split must be three positive shares summing to 1, got {self.split}")
        if self.reward_source == "probe" and (self.reward_samples > 1 or self.reward_temperature > 0):
            raise ValueError(
                "reward_samples and reward_temperature need reward_source=generator (a probe is one greedy answer)"
            )
        return self
