"""A Ray Data batch stage as one object, as Ray's own batch stages are (``ray.llm``'s ``StatefulStage``): the
callable class, its constructor arguments and its ``map_batches`` arguments together, and the input columns
it reads declared on the class and checked, on every batch, in one place.

The probe's generation stage, the features stage and the index build's encoders are such stages::

    stage = BatchStage(FeatureStage, {"questions": ...}, actors=4, batch_size=32, num_cpus=1)
    features = stage.apply(packed)  # ds.map_batches(FeatureStage, fn_constructor_kwargs=..., compute=...)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

if TYPE_CHECKING:
    from ray.data import Dataset


class BatchUDF:
    """Base of a batch stage's callable class: ``input_columns`` names the columns it reads; each batch is
    checked for them, then handed to :meth:`process` (an Arrow table in, an Arrow table out)."""

    stage_name: ClassVar[str] = "batch stage"
    input_columns: ClassVar[tuple[str, ...]] = ()

    def __call__(self, batch: pa.Table) -> pa.Table:
        missing = [c for c in self.input_columns if c not in batch.column_names]
        if missing:
            raise ValueError(f"{self.stage_name} input lacks columns {missing}")
        return self.process(batch)

    def process(self, batch: pa.Table) -> pa.Table:
        raise NotImplementedError


@dataclass(frozen=True)
class BatchStage:
    """One actor-pool stage: ``udf`` built with ``constructor_kwargs`` in each of ``actors`` actors, fed Arrow
    batches of ``batch_size`` rows (which must hold ``udf.input_columns``); ``pool`` holds further
    ``ActorPoolStrategy`` arguments, ``options`` further ``map_batches`` (Ray remote) arguments such as
    restarts and retries."""

    udf: type[BatchUDF]
    constructor_kwargs: Mapping[str, Any]
    actors: int
    batch_size: int | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: dict[str, float] | None = None
    pool: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, ds: Dataset) -> Dataset:
        """``ds`` mapped through this stage (lazily, as every Ray Data step)."""
        from ray.data import ActorPoolStrategy

        with warnings.catch_warnings():
            # Ray 2.60 deprecates remote arguments such as max_restarts in map_batches' **kwargs but offers
            # no named parameter for them yet: they are still the only way to set an actor pool's restarts.
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*is deprecated")
            return ds.map_batches(
                self.udf,
                fn_constructor_kwargs=dict(self.constructor_kwargs),
                batch_size=self.batch_size,
                batch_format="pyarrow",
                compute=ActorPoolStrategy(size=self.actors, **self.pool),
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                resources=self.resources,
                **self.options,
            )
