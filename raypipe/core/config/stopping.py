"""The ``stopping`` section: the stopping policies and the sweep's head refits."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from raypipe.core.config.base import (
    PAPER_F1_SHARE,
    PAPER_THETA_P,
    PAPER_THETA_U,
    SEED_HEAD_HIDDEN,
    SEED_HEAD_LEARNING_RATE,
    SEED_HEAD_WEIGHT_DECAY,
    StrictModel,
)


class HeadRefit(StrictModel):
    """A head training setting the stopping sweep refits (raypipe.stopping.refit)."""

    group: str | None = Field(
        default=None, description="Signal group, e.g. 'unsup+sup+prob'; None = train.chosen_group."
    )
    window: int | None = Field(default=None, ge=1, description="Head window; None = train.chosen_window.")
    head_hidden: list[int] = Field(default_factory=lambda: list(SEED_HEAD_HIDDEN))
    head_weight_decay: float = Field(default=SEED_HEAD_WEIGHT_DECAY, ge=0)
    head_learning_rate: float = Field(default=SEED_HEAD_LEARNING_RATE, gt=0)


# The heuristic's named variants (their options: raypipe.stopping.heuristic.VARIANTS).
HeuristicVariant = Literal["paper", "delta_p", "mean_utility", "best_rollback", "quality_floor", "give_up"]
ControllerBackend = Literal["onnx", "torch"]


class StoppingConfig(StrictModel):
    """Prediction-guided early stopping: the online controller and the sweep (jobs/sweep.py)."""

    theta_p: float = Field(
        default=PAPER_THETA_P, description="θ_P of the online controller (default: the paper's operating point)."
    )
    theta_u: float = Field(default=PAPER_THETA_U, description="θ_U of the online controller.")
    variant: HeuristicVariant = Field(
        default="paper", description="Heuristic variant of the online controller (raypipe.stopping.heuristic.VARIANTS)."
    )
    crossencoder_backend: ControllerBackend = Field(
        default="onnx",
        description="How the online controller runs the bundle's cross-encoders (raypipe.predict.scorers): onnx "
        "(exported once into the cache, ONNX Runtime on the CPU, fp32: outputs within 1e-4 of torch's) or torch "
        "(the reference, as training's out-of-fold predictions run them).",
    )
    sentence_backend: ControllerBackend = Field(
        default="onnx",
        description="How the online controller's feature extractor runs features.sentence_model (the similarity "
        "signals): onnx (the retrieval encoder's ONNX machinery, fp32: the same cosines to 1e-5) or torch "
        "(sentence-transformers, as the features stage runs it).",
    )
    crossencoder_threads: int | None = Field(
        default=None,
        ge=1,
        description="ONNX Runtime intra-op threads of the controller's cross-encoders and sentence encoder; None: "
        "ONNX Runtime's default (the physical cores). The torch backend keeps torch's own setting.",
    )
    theta_p_grid: list[float] = Field(
        default_factory=lambda: [round(0.05 * i, 2) for i in range(21)], description="θ_P values swept."
    )
    theta_u_grid: list[float] = Field(
        default_factory=lambda: [round(-0.3 + 0.05 * i, 2) for i in range(17)], description="θ_U values swept."
    )
    quantile_points: int = Field(
        default=9,
        ge=0,
        description="Also sweep this many quantiles of the validation P̂ / Û (weak models predict in a narrow range).",
    )
    variants: list[HeuristicVariant] = Field(
        default_factory=lambda: list(get_args(HeuristicVariant)),
        description="Heuristic variants swept; 'paper' is the faithful one.",
    )
    heads: Literal["chosen", "windows", "all"] = Field(
        default="windows",
        description="Predictions swept: the chosen head only, every window of its feature group, or every "
        "feature group x window of prediction_grid.",
    )
    refits: list[HeadRefit] = Field(
        default_factory=lambda: [HeadRefit(), HeadRefit(head_hidden=[32, 16], head_weight_decay=1e-2)],
        description="Head training settings refit as extra Tune trials (needs features/); [] = none.",
    )
    val_fraction: float = Field(
        default=0.5, gt=0, lt=1, description="Share of questions (by qid hash) for choosing thresholds."
    )
    split_seed: int = 0
    min_f1_share: float = Field(
        default=PAPER_F1_SHARE,
        gt=0,
        description="Selection: least share of natural F1 kept on validation (the paper's 97.6%).",
    )
    max_concurrent_trials: int = Field(default=2, ge=1)
    trial_num_cpus: float = Field(
        default=0.5, gt=0, description="CPUs per Tune trial (0.5: a small-machine default, as for the actor pools)."
    )
