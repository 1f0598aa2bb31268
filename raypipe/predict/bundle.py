"""The predictor bundle that the stopping stage and the online controller load (RUN_DIR/models/).

Layout: ``manifest.json`` (feature group, window, feature columns, cross-encoder folders relative to
the bundle folder, the training config), ``head_p.pkl`` / ``head_u.pkl`` (scaler + imputer + MLP), and
the cross-encoders it names (Ray Train checkpoints copied under ``crossencoders/``).

``predict(history_rows, question)`` takes the iteration rows of one trajectory so far (the last is the
current iteration) and returns (p_hat, u_hat) for the current iteration; ``predict_many`` does the same for
several trajectories at once (the controller's batch of trajectories waiting on a decision): each
cross-encoder scores every trajectory's new texts in one call and each head runs once. Feature columns present
in the rows are used as they are; supervised signals are computed by the cross-encoders (needs reasoning and
query of the rows, and the current top document: ``doc_titles``/``doc_texts`` in the row or ``doc_lookup``),
run by ``scorer_backend`` (:mod:`raypipe.predict.scorers`: ``torch``, the reference, or ``onnx``); the other
signals come from ``feature_extractor([(rows, question), ...]) -> feature rows of each``, e.g.
``functools.partial(raypipe.features.extract.extract_many, corpus=..., sentences=...)``.
"""

from __future__ import annotations

import json
import pickle
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raypipe.core.config import ControllerBackend
from raypipe.predict.relations import SHORT, DocLookup, format_relation, lookup_top_doc, trajectory_texts
from raypipe.predict.scorers import Scorer, load_scorer
from raypipe.predict.window import FIRST_ITERATION, window_for_last

MANIFEST = "manifest.json"
History = tuple[Sequence[Mapping[str, Any]], str]  # one trajectory's iteration rows so far and its question
FeatureExtractor = Callable[[Sequence[History]], list[list[dict[str, Any]]]]
# cross-encoder scores a bundle keeps, by (qid, iteration, column): far more than the windows of the trajectories in
# flight need (16 in flight x window 3 x 3 relations = 144), and a bound for a service that lives for days
SCORE_CACHE_SIZE = 16384


class ScoreCache:
    """Scores by key, the least recently used dropped past ``size`` entries."""

    def __init__(self, size: int = SCORE_CACHE_SIZE):
        self.size = size
        self._scores: OrderedDict[tuple[str, int, str], float] = OrderedDict()

    def __contains__(self, key: tuple[str, int, str]) -> bool:
        return key in self._scores

    def __len__(self) -> int:
        return len(self._scores)

    def __getitem__(self, key: tuple[str, int, str]) -> float:
        self._scores.move_to_end(key)
        return self._scores[key]

    def __setitem__(self, key: tuple[str, int, str], value: float) -> None:
        self._scores[key] = value
        self._scores.move_to_end(key)
        while len(self._scores) > self.size:
            self._scores.popitem(last=False)


class PredictorBundle:
    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        heads: dict[str, Any],
        doc_lookup: DocLookup | None = None,
        feature_extractor: FeatureExtractor | None = None,
        scorer_backend: ControllerBackend = "torch",
        scorer_threads: int | None = None,
        scorers: Mapping[str, Scorer] | None = None,
    ):
        """``scorers``: cross-encoders already loaded, by ``sup_*`` column (the others load on first use)."""
        self.root = root
        self.manifest = manifest
        self.heads = heads
        self.feature_group: str = manifest["feature_group"]
        self.window: int = int(manifest["window"])
        self.feature_columns: list[str] = list(manifest["feature_columns"])
        self.sup_models: dict[str, str] = dict(manifest["crossencoders"])
        self.max_tokens: int = int(manifest["train"]["max_tokens"])
        self.field_chars: int = int(manifest["train"]["field_chars"])
        self.title_chars: int = int(manifest["train"]["title_chars"])
        self.reasoning_text: str = manifest["train"].get("reasoning_text", "parsed")
        self.doc_lookup = doc_lookup
        self.feature_extractor = feature_extractor
        self.scorer_backend, self.scorer_threads = scorer_backend, scorer_threads
        self._scorers: dict[str, Scorer] = dict(scorers or {})
        self._sup_cache = ScoreCache()

    @classmethod
    def load(
        cls,
        path: str | Path,
        doc_lookup: DocLookup | None = None,
        feature_extractor: FeatureExtractor | None = None,
        scorer_backend: ControllerBackend = "torch",
        scorer_threads: int | None = None,
    ) -> PredictorBundle:
        """Open a bundle folder (RUN_DIR/models); its cross-encoders run by ``scorer_backend``."""
        root = Path(path)
        if not (root / MANIFEST).exists():
            raise FileNotFoundError(f"{root}: no {MANIFEST}; run jobs/train.py on the run directory first")
        manifest = json.loads((root / MANIFEST).read_text())
        heads = {}
        for short in ("p", "u"):
            with open(root / f"head_{short}.pkl", "rb") as fh:
                heads[short] = pickle.load(fh)
        return cls(root, manifest, heads, doc_lookup, feature_extractor, scorer_backend, scorer_threads)

    @property
    def needs_feature_extractor(self) -> bool:
        return any(c not in self.sup_models for c in self.feature_columns)

    def predict(self, history_rows: Sequence[Mapping[str, Any]], question: str) -> tuple[float, float]:
        return self.predict_many([(history_rows, question)])[0]

    def predict_many(self, histories: Sequence[History]) -> list[tuple[float, float]]:
        """(p_hat, u_hat) of each trajectory's current iteration, all trajectories in one pass (module docstring)."""
        if not histories:
            return []
        options = self.manifest.get("window_options", {})
        frames = self.feature_frames(histories)
        x = np.vstack([window_for_last(f, self.feature_columns, self.window, **options) for f in frames])
        p_hat, u_hat = self.heads["p"].predict(x), self.heads["u"].predict(x)
        return [(float(p), float(u)) for p, u in zip(p_hat, u_hat)]

    def feature_frame(self, history_rows: Sequence[Mapping[str, Any]], question: str) -> pd.DataFrame:
        """The head's feature columns for the iterations of the current window (one row per iteration)."""
        return self.feature_frames([(history_rows, question)])[0]

    def feature_frames(self, histories: Sequence[History]) -> list[pd.DataFrame]:
        """:meth:`feature_frame` of each trajectory; the extractor and each cross-encoder called once for all."""
        ordered = [(sorted(rows, key=lambda r: int(r["iteration"])), question) for rows, question in histories]
        windows = [self._window_rows(rows) for rows, _ in ordered]
        others = [c for c in self.feature_columns if c not in self.sup_models]
        lacking = [k for k, wanted in enumerate(windows) if any(c not in r for r in wanted for c in others)]
        extracted: dict[int, dict[int, dict[str, Any]]] = {}
        if lacking:
            if self.feature_extractor is None:
                missing = sorted({c for k in lacking for r in windows[k] for c in others if c not in r})
                raise ValueError(f"rows lack features {missing} and the bundle has no feature_extractor")
            rows_of = self.feature_extractor([ordered[k] for k in lacking])
            extracted = {k: {int(f["iteration"]): f for f in rows} for k, rows in zip(lacking, rows_of)}
        supervised = self._supervised(ordered, windows)
        frames = []
        for k, wanted in enumerate(windows):
            frame = pd.DataFrame(
                {"qid": [str(r.get("qid", "")) for r in wanted], "iteration": [int(r["iteration"]) for r in wanted]}
            )
            source = extracted.get(k)
            for c in others:
                frame[c] = [r[c] if source is None else source.get(int(r["iteration"]), {}).get(c) for r in wanted]
            for column, values in supervised[k].items():
                frame[column] = values
            for c in self.feature_columns:
                frame[c] = pd.to_numeric(frame[c], errors="coerce")
            frames.append(frame)
        return frames

    def _window_rows(self, rows: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The rows of the current iteration's window (``rows`` ordered by iteration)."""
        if not rows or int(rows[-1]["iteration"]) < FIRST_ITERATION:
            raise ValueError("predictions start at iteration 1 (the first retrieval iteration)")
        current = int(rows[-1]["iteration"])
        return [
            r for r in rows if current - self.window < int(r["iteration"]) and int(r["iteration"]) >= FIRST_ITERATION
        ]

    def _supervised(
        self, ordered: list[History], windows: list[list[Mapping[str, Any]]]
    ) -> list[dict[str, list[float]]]:
        """Cross-encoder signals of each trajectory's window, cached per (qid, iteration, column); each
        cross-encoder scores the texts no trajectory has cached in one call."""
        lookup = lookup_top_doc(self.doc_lookup)
        qids = [str(rows[-1].get("qid", "")) for rows, _ in ordered]
        texts: dict[int, dict[int, Any]] = {}  # each trajectory's relation inputs, built when one is needed
        out: list[dict[str, list[float]]] = [{} for _ in ordered]
        for column in self.sup_models:
            if column not in self.feature_columns:
                continue
            relation = _relation_of(column)
            keys = [[(qids[k], int(r["iteration"]), column) for r in wanted] for k, wanted in enumerate(windows)]
            scores = {key: self._sup_cache[key] for trajectory in keys for key in trajectory if key in self._sup_cache}
            todo = [(k, key[1]) for k, trajectory in enumerate(keys) for key in trajectory if key not in scores]
            if todo:
                for k in {k for k, _ in todo} - texts.keys():
                    rows, question = ordered[k]
                    texts[k] = dict(trajectory_texts(question, list(rows), lookup, self.reasoning_text))
                inputs = [format_relation(relation, texts[k][i], self.field_chars, self.title_chars) for k, i in todo]
                for (k, i), value in zip(todo, self.scorer(column).score(inputs, self.max_tokens)):
                    scores[(qids[k], i, column)] = self._sup_cache[(qids[k], i, column)] = float(value)
            for k, trajectory in enumerate(keys):
                out[k][column] = [scores[key] for key in trajectory]
        return out

    def scorer(self, column: str) -> Scorer:
        """The cross-encoder of a ``sup_*`` column, loaded on first use."""
        if column not in self._scorers:
            folder = self.root / self.sup_models[column]
            self._scorers[column] = load_scorer(folder, self.scorer_backend, threads=self.scorer_threads)
        return self._scorers[column]


def _relation_of(column: str) -> str:
    """sup_<target>_<short relation> -> relation name."""
    short = column.rsplit("_", 1)[-1]
    return next(rel for rel, s in SHORT.items() if s == short)
