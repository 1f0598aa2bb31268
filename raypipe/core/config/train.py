"""The ``train`` section: the predictors of P_i and U_i."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from raypipe.core.config.base import (
    SEED_HEAD_HIDDEN,
    SEED_HEAD_LEARNING_RATE,
    SEED_HEAD_WEIGHT_DECAY,
    ReasoningText,
    StrictModel,
)

# The cross-encoders' relations (raypipe.predict.relations.RELATIONS).
Relation = Literal["adjacent_think", "long_distance", "intra_iteration"]


class TrainConfig(StrictModel):
    """Predictors of P_i and U_i (``jobs/train.py``). Defaults are the seed paper's; presets shrink them."""

    base_model: str = Field(default="minilm", description="Cross-encoder base: embedded name or a local HF folder.")
    relations: list[Relation] = Field(default_factory=lambda: list(get_args(Relation)))
    field_chars: int = Field(default=256, ge=1, description="Characters kept of each text field (seed: 256).")
    title_chars: int = Field(default=128, ge=1, description="Characters kept of the document title (seed: 128).")
    reasoning_text: ReasoningText = "parsed"
    max_tokens: int = Field(default=512, ge=16, description="Cross-encoder input tokens (truncated at the end).")
    learning_rate: float = Field(default=2e-5, gt=0)
    weight_decay: float = Field(
        default=0.0,
        ge=0,
        description="Cross-encoders' AdamW weight decay (seed: 0.0, predictions/supervised/train.py); 0.01 is torch's "
        "AdamW default, what raypipe used before.",
    )
    dropout: float | None = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Cross-encoders' hidden and attention dropout while training (seed: 0.0, predictions/supervised/"
        "relations.py build_regression_model); None = the base model's own (0.1 for MiniLM, what raypipe used before).",
    )
    epochs: int = Field(default=3, ge=1)
    effective_batch_size: int = Field(default=256, ge=1, description="batch_size x workers x accumulation steps.")
    batch_size: int = Field(default=16, ge=1, description="Per worker and micro-step.")
    num_workers: int = Field(default=2, ge=1, description="Ray Train data-parallel workers.")
    use_gpu: bool = False
    cpus_per_worker: float = Field(default=1.0, gt=0)
    folds: int = Field(
        default=5, ge=2, description="k-fold by question: every row predicted by models that never saw it."
    )
    crossencoder_folds: int | None = Field(
        default=None,
        ge=2,
        description="k of the cross-encoders' own question folds (fewer models to train); None = folds.",
    )
    refit_full: bool = Field(
        default=False, description="Bundle cross-encoders refit on all questions (6 more trainings); else fold 0's."
    )
    unsup_columns: Literal["seed", "all"] = Field(
        default="seed", description="seed: the seed paper's nine unsupervised signals; all: every FEATURES signal."
    )
    groups: list[str] = Field(
        default_factory=lambda: ["unsup", "sup", "prob", "unsup+sup", "unsup+prob", "sup+prob", "unsup+sup+prob"],
        description="Table 3 rows: '+'-joined signal families (unsup, sup, prob).",
    )
    windows: list[int] = Field(
        default_factory=lambda: [1, 2, 3, 4, 5], description="Head windows w (w=1 is the baseline)."
    )
    ablation_group: str = Field(default="unsup", description="Table 4: this group with each unsupervised source alone.")
    ablation_windows: list[int] | None = Field(default=None, description="Table 4 windows; None = windows.")
    chosen_group: str = Field(
        default="unsup+sup+prob", description="Head configuration written to predictions/ and the bundle."
    )
    chosen_window: int = Field(default=3, ge=1)
    head: Literal["seed", "sklearn"] = Field(
        default="seed",
        description="seed: the seed's torch MLP (predictions/prediction_head/mlp.py: Adam with weight decay on the "
        "full MSE, biases decayed too); sklearn: scikit-learn's MLPRegressor (L2 penalty head_alpha), raypipe's head "
        "before this option.",
    )
    head_input: Literal["seed", "indicators"] = Field(
        default="seed",
        description="seed: NaN set to 0, then standard scaling, no missing-value indicators (mlp.py); indicators: "
        "scale the observed values, fill NaN with 0 (the mean) and add one slot<k>_missing column per window slot.",
    )
    include_type: bool = Field(
        default=True,
        description="One-hot of the question's dataset type (HotpotQA bridge/comparison, 2Wiki, MuSiQue hops) as head "
        "inputs, as the seed's include_type=True (prediction_head/train.py, sequential.py).",
    )
    window_slots: Literal["previous", "seed_public"] = Field(
        default="previous",
        description="previous: slot k holds iteration i-k's signals (the paper's text); seed_public: every slot "
        "repeats iteration i's (the public sequential.py, for reproducing its published numbers).",
    )
    head_hidden: list[int] = Field(default_factory=lambda: list(SEED_HEAD_HIDDEN))
    head_weight_decay: float = Field(
        default=SEED_HEAD_WEIGHT_DECAY, ge=0, description="Adam weight decay of the seed head (head=seed)."
    )
    head_alpha: float | None = Field(
        default=None,
        ge=0,
        description="L2 penalty of the sklearn head (head=sklearn); None = the equivalent of head_weight_decay on "
        "full batches, head_weight_decay x head_batch_size / 2 (raypipe.predict.head.equivalent_alpha).",
    )
    head_learning_rate: float = Field(default=SEED_HEAD_LEARNING_RATE, gt=0)
    head_batch_size: int = Field(default=256, ge=1)
    head_max_iter: int = Field(default=300, ge=1)
    head_patience: int = Field(default=15, ge=1)
    head_validation_fraction: float = Field(default=0.1, gt=0, lt=1)
    fisher_alternative: Literal["greater", "two-sided"] = Field(
        default="greater", description="Fisher z test of each window vs w=1: a gain (one-sided) or any difference."
    )
    significance: float = Field(default=0.05, gt=0, lt=1)
    bootstrap_samples: int = Field(default=1000, ge=1, description="Resamples of the questions for the intervals.")
    confidence: float = Field(default=0.95, gt=0, lt=1)

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        for group in [*self.groups, self.ablation_group, self.chosen_group]:
            unknown = set(group.split("+")) - {"unsup", "sup", "prob"}
            if unknown or not group:
                raise ValueError(f"feature group {group!r}: families are unsup, sup, prob joined by '+'")
        if 1 not in self.windows:
            raise ValueError("windows must include 1 (the baseline of the Fisher z test)")
        if self.ablation_windows is not None and 1 not in self.ablation_windows:
            raise ValueError("ablation_windows must include 1 (the baseline of the Fisher z test)")
        if self.chosen_window not in self.windows:
            raise ValueError(f"chosen_window {self.chosen_window} is not among windows {self.windows}")
        return self
