"""The online controller: the 4-state heuristic on a predictor bundle's P̂/Û while the agent runs.

:class:`OnlineController` implements :class:`raypipe.agents.hooks.StopController`. After each
iteration the agent loop calls ``decide(question, history)``; the controller predicts (P̂_i, Û_i) for
the new iterations with the bundle (``raypipe.predict.bundle``; predictions start at iteration 1),
replays :class:`FourStateHeuristic` over the trajectory's predictions so far, and says stop when the
heuristic fires (naming a rolled-back iteration when state 3 returns an earlier answer). The saving is
real compute: the agent generates no further turns.

The controller is picklable and loads the bundle lazily, so it travels to the generation actors and
each actor opens its own copy. Its predictions go through a :class:`~raypipe.stopping.batching.PredictionBatcher`:
the trajectories of an actor waiting on a decision are predicted together, in one worker thread (the bundle is
not meant for concurrent use) so the actor's event loop keeps serving the other trajectories. A served replica
shares one batcher between its requests' controllers (``source``).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from raypipe.agents.hooks import CONTINUE, StopDecision
from raypipe.core.config import RunConfig, load_config
from raypipe.core.rows import OnlineRow
from raypipe.features.extract import extract_many
from raypipe.features.memo import MemoCorpus, MemoSentences
from raypipe.features.resources import (
    CorpusResources,
    IndexCorpus,
    OnnxSentenceEncoder,
    SbertEncoder,
    SentenceEncoder,
)
from raypipe.predict.bundle import MANIFEST as BUNDLE_MANIFEST
from raypipe.predict.bundle import FeatureExtractor
from raypipe.stopping.batching import PredictionBatcher, Predictor
from raypipe.stopping.heuristic import (
    PAPER_OPTIONS,
    PAPER_THRESHOLDS,
    VARIANTS,
    FourStateHeuristic,
    HeuristicOptions,
    Thresholds,
)

log = logging.getLogger(__name__)
MAX_TRACKED = 10_000  # trajectories whose predictions are kept between calls


class PredictionSource(Protocol):
    async def predict(self, history_rows: Sequence[Mapping[str, Any]], question: str) -> tuple[float, float]: ...


PredictorFactory = Callable[[], Predictor]


class LazyPredictions:
    """A :class:`PredictionSource` over the predictor ``factory`` makes on first use, in the process that asks (a
    generation actor's own copy), behind a :class:`~raypipe.stopping.batching.PredictionBatcher` (the trajectories
    waiting on a decision predicted together). Picklable when ``factory`` is: a copy starts unloaded."""

    def __init__(self, factory: PredictorFactory):
        self.factory = factory
        self.batcher: PredictionBatcher | None = None  # built on first use: the process's own

    def __getstate__(self) -> dict:
        return {**self.__dict__, "batcher": None}

    async def predict(self, history_rows: Sequence[Mapping[str, Any]], question: str) -> tuple[float, float]:
        if self.batcher is None:
            self.batcher = PredictionBatcher(self.factory)
        return await self.batcher.predict(history_rows, question)


@dataclass(frozen=True)
class BundleLoader:
    """The picklable factory of a bundle's predictor: :func:`load_bundle_predictor` with the run config as JSON."""

    path: str
    config: dict | None = None

    def __call__(self) -> Predictor:
        config = RunConfig.model_validate(self.config) if self.config is not None else None
        return load_bundle_predictor(self.path, config)


def bundle_predictions(path: str | Path, config: RunConfig | None = None) -> LazyPredictions:
    """The predictions of the bundle at ``path``, loaded where they are first asked for."""
    return LazyPredictions(BundleLoader(str(path), config.model_dump(mode="json") if config is not None else None))


def bundle_folder(path: str | Path) -> Path:
    """The predictor bundle a ``--controller PATH`` names: PATH itself or a run directory's ``models/``."""
    folder = Path(path)
    if not (folder / BUNDLE_MANIFEST).exists() and (folder / "models" / BUNDLE_MANIFEST).exists():
        folder = folder / "models"
    if not (folder / BUNDLE_MANIFEST).exists():
        raise FileNotFoundError(
            f"{path}: no predictor bundle ({BUNDLE_MANIFEST}) here or under models/; run jobs/train.py first"
        )
    return folder


def load_bundle_predictor(bundle_path: str | Path, config: RunConfig | None = None) -> Predictor:
    """A :class:`raypipe.predict.bundle.PredictorBundle`, with the feature extractor its head needs.

    Supervised signals come from the bundled cross-encoders (reading the visible documents the loop
    passes in the history), run by ``stopping.crossencoder_backend``; the other signals need the run's
    retrieval index and sentence encoder (run by ``stopping.sentence_backend``), opened from ``config``
    (default: the embedded preset) behind memories (:mod:`raypipe.features.memo`), so each decision encodes
    only what its iteration added.
    """
    from raypipe.predict.bundle import PredictorBundle

    config = config or load_config()
    stopping = config.stopping
    bundle = PredictorBundle.load(
        bundle_path, scorer_backend=stopping.crossencoder_backend, scorer_threads=stopping.crossencoder_threads
    )
    if bundle.needs_feature_extractor:
        bundle.feature_extractor = memo_feature_extractor(config, IndexCorpus.open(config), sentence_encoder(config))
    log.info(
        "online controller: bundle %s (%s, w=%d), cross-encoders on %s",
        bundle_path,
        bundle.feature_group,
        bundle.window,
        stopping.crossencoder_backend,
    )
    return bundle


def memo_feature_extractor(config: RunConfig, corpus: CorpusResources, sentences: SentenceEncoder) -> FeatureExtractor:
    """The unsupervised signals of a decision's window, computed from ``corpus`` and ``sentences`` behind fresh
    memories (each decision encodes and searches only what its iteration added)."""
    memo_corpus, memo_sentences = MemoCorpus(corpus), MemoSentences(sentences)
    return partial(extract_many, corpus=memo_corpus, sentences=memo_sentences, settings=config.features)


def sentence_encoder(config: RunConfig) -> SentenceEncoder:
    """The controller's encoder of ``features.sentence_model``, run by ``stopping.sentence_backend``."""
    ref, stopping = config.features.sentence_model, config.stopping
    return (
        OnnxSentenceEncoder(ref, stopping.crossencoder_threads)
        if stopping.sentence_backend == "onnx"
        else SbertEncoder(ref)
    )


class OnlineController:
    """Stop trajectories in flight with the 4-state heuristic on predicted P̂/Û.

    ``thresholds``: one :class:`Thresholds` (or a (θ_P, θ_U) pair), or a mapping from dataset name to
    thresholds with ``"*"`` for the rest (per-dataset choices of the sweep). Its predictions: ``source`` (a served
    replica's one batcher for all its requests, or :func:`bundle_predictions`), else the predictor
    ``predictor_factory`` makes (tests, other predictors), else the bundle at ``bundle_path``, each loaded on first
    use (:class:`LazyPredictions`).
    """

    def __init__(
        self,
        bundle_path: str | Path | None,
        thresholds: Thresholds | tuple[float, float] | Mapping[str, Thresholds] = PAPER_THRESHOLDS,
        options: HeuristicOptions = PAPER_OPTIONS,
        *,
        config: RunConfig | None = None,
        predictor_factory: PredictorFactory | None = None,
        source: PredictionSource | None = None,
    ):
        if bundle_path is None and predictor_factory is None and source is None:
            raise ValueError("OnlineController needs a bundle path, a predictor factory or a prediction source")
        if options.first_iteration != 1:
            raise ValueError("the predictor bundle predicts from iteration 1 on; first_iteration must be 1")
        self.bundle_path = None if bundle_path is None else str(bundle_path)
        self.thresholds = _threshold_map(thresholds)
        self.options = options
        if source is None:
            source = (
                LazyPredictions(predictor_factory)
                if predictor_factory is not None
                else bundle_predictions(str(bundle_path), config)
            )
        self.source = source
        self._predictions: OrderedDict[str, dict[int, tuple[float, float]]] = OrderedDict()

    @classmethod
    def from_selected(
        cls,
        selected_json: str | Path,
        bundle_path: str | Path,
        which: str = "faithful",
        config: RunConfig | None = None,
    ) -> OnlineController:
        """The controller a sweep chose (``RUN_DIR/stopping/selected.json``: paper, faithful or best).

        The chosen head must be the bundle's (the bundle holds one head configuration).
        """
        chosen = json.loads(Path(selected_json).read_text())[which]
        manifest = json.loads((Path(bundle_path) / BUNDLE_MANIFEST).read_text())
        head = (manifest["feature_group"], int(manifest["window"]))
        if head != (chosen["feature_group"], int(chosen["window"])):
            raise ValueError(
                f"{selected_json} [{which}] was chosen for head {chosen['feature_group']}/w{chosen['window']}, "
                f"but the bundle {bundle_path} holds {head[0]}/w{head[1]}"
            )
        thresholds = {ds: Thresholds(t["theta_p"], t["theta_u"]) for ds, t in chosen["thresholds"].items()}
        return cls(bundle_path, thresholds, VARIANTS[chosen["variant"]], config=config)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_predictions": OrderedDict()}

    def thresholds_for(self, dataset: str | None) -> Thresholds:
        return self.thresholds.get(dataset or "", self.thresholds["*"])

    async def decide(self, question: str, history: list[OnlineRow]) -> StopDecision:
        if not history:
            return CONTINUE
        current = history[-1]
        iteration = int(current["iteration"])
        if iteration < self.options.first_iteration:
            return CONTINUE
        qid = str(current["qid"])
        preds = self._predictions.setdefault(qid, {})
        self._predictions.move_to_end(qid)
        while len(self._predictions) > MAX_TRACKED:
            self._predictions.popitem(last=False)
        for k, row in enumerate(history):
            i = int(row["iteration"])
            if i >= self.options.first_iteration and i not in preds:
                preds[i] = await self._predict(history[: k + 1], question)
        heuristic = FourStateHeuristic(self.thresholds_for(current.get("dataset")), self.options)
        decision = CONTINUE
        for i in range(self.options.first_iteration, iteration + 1):
            if i not in preds:
                raise ValueError(f"question {qid}: history lacks iteration {i}")
            decision = heuristic.step(i, *preds[i])
            if decision.stop:
                break
        if decision.stop:
            self._predictions.pop(qid, None)
        return decision

    async def _predict(self, rows: list[OnlineRow], question: str) -> tuple[float, float]:
        return await self.source.predict(rows, question)


def _threshold_map(thresholds: Thresholds | tuple[float, float] | Mapping[str, Thresholds]) -> dict[str, Thresholds]:
    if isinstance(thresholds, Thresholds):
        return {"*": thresholds}
    if isinstance(thresholds, tuple):
        return {"*": Thresholds(*thresholds)}
    out = dict(thresholds)
    if "*" not in out:
        raise ValueError("per-dataset thresholds need a '*' entry for other datasets")
    return out
