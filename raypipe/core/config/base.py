"""Shared by every section: the config error, the strict model, the seed paper's reference figures."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# The seed paper's reported operating point (Tian et al.): these θ_P, θ_U gave the iterations change at the
# share of natural F1 below. The stopping defaults, the sweep's comparison and Stop-RAG's share objective use it.
PAPER_THETA_P = 0.3
PAPER_THETA_U = 0.2
PAPER_THETA_U_STRICT = 0.3  # the paper's second operating point: θ_U=0.3 keeps 98.49% of natural F1
PAPER_ITERATIONS_CHANGE = -0.1089
PAPER_F1_SHARE = 0.976
# The seed's prediction head (jobs/train.py), also the base of the sweep's head refits.
SEED_HEAD_HIDDEN = (16, 8)
SEED_HEAD_WEIGHT_DECAY = 1e-3  # Adam weight decay of the seed's torch head (predictions/prediction_head/mlp.py)
SEED_HEAD_LEARNING_RATE = 1e-3


class ConfigError(ValueError):
    """A configuration that cannot be loaded or does not validate."""


# r_i as the SBERT similarities (features) and the cross-encoders (train) read it; one definition for both.
ReasoningText = Annotated[
    Literal["parsed", "raw"],
    Field(
        description="r_i: parsed = the think text without the search action, query markup or final answer (the "
        "seed's parsing of Search-R1 and R1-Searcher turns); raw = the turn's whole output."
    ),
]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def nested_section(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    """The model of ``model``'s field ``key`` when that field is a section of its own (``RunConfig.retrieval``,
    ``RetrievalConfig.index``), else None (a plain setting, a mapping-valued one included, or no such field)."""
    field = model.model_fields.get(key)
    annotation = field.annotation if field is not None else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
