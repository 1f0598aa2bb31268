"""The predictor bundle that the stopping stage and the online controller load (RUN_DIR/models/).

Layout: ``manifest.json`` (feature group, window, feature columns, cross-encoder folders relative to
the bundle folder, the training config), ``head_p.pkl`` / ``head_u.pkl`` (scaler + imputer + MLP), and
the cross-encoders it names (Ray Train checkpoints copied under ``crossencoders/``).

``predict(history_rows, question)`` takes the iteration rows of one trajectory so far (the last is the
current iteration) and returns (p_hat, u_hat) for the current iteration. Feature columns present in the
rows are used as they are; supervised signals are computed by the cross-encoders (needs reasoning and
query of the rows, and the current top document: ``doc_titles``/``doc_texts`` in the row or
``doc_lookup``); the other signals come from ``feature_extractor(rows, question) -> feature rows``, e.g.
``functools.partial(raypipe.features.extract.extract_trajectory, corpus=..., sentences=...)``.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from raypipe.predict.relations import SHORT, DocLookup, format_relation, lookup_top_doc, trajectory_texts
from raypipe.predict.window import FIRST_ITERATION, window_for_last

MANIFEST = "manifest.json"
FeatureExtractor = Callable[[Sequence[dict[str, Any]], str], list[dict[str, Any]]]


class PredictorBundle:
    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        heads: dict[str, Any],
        doc_lookup: DocLookup | None = None,
        feature_extractor: FeatureExtractor | None = None,
    ):
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
        self._encoders: dict[str, Any] = {}
        self._sup_cache: dict[tuple[str, int, str], float] = {}

    @classmethod
    def load(
        cls, path: str | Path, doc_lookup: DocLookup | None = None, feature_extractor: FeatureExtractor | None = None
    ) -> PredictorBundle:
        """Open a bundle folder (RUN_DIR/models)."""
        root = Path(path)
        if not (root / MANIFEST).exists():
            raise FileNotFoundError(f"{root}: no {MANIFEST}; run jobs/train.py on the run directory first")
        manifest = json.loads((root / MANIFEST).read_text())
        heads = {}
        for short in ("p", "u"):
            with open(root / f"head_{short}.pkl", "rb") as fh:
                heads[short] = pickle.load(fh)
        return cls(root, manifest, heads, doc_lookup, feature_extractor)

    @property
    def needs_feature_extractor(self) -> bool:
        return any(c not in self.sup_models for c in self.feature_columns)

    def predict(self, history_rows: Sequence[dict[str, Any]], question: str) -> tuple[float, float]:
        frame = self.feature_frame(history_rows, question)
        x = window_for_last(frame, self.feature_columns, self.window, **self.manifest.get("window_options", {}))
        return float(self.heads["p"].predict(x)[0]), float(self.heads["u"].predict(x)[0])

    def feature_frame(self, history_rows: Sequence[dict[str, Any]], question: str) -> pd.DataFrame:
        """The head's feature columns for the iterations of the current window (one row per iteration)."""
        rows = sorted(history_rows, key=lambda r: int(r["iteration"]))
        if not rows or int(rows[-1]["iteration"]) < FIRST_ITERATION:
            raise ValueError("predictions start at iteration 1 (the first retrieval iteration)")
        current = int(rows[-1]["iteration"])
        wanted = [
            r for r in rows if current - self.window < int(r["iteration"]) and int(r["iteration"]) >= FIRST_ITERATION
        ]
        frame = pd.DataFrame(
            {"qid": [str(r.get("qid", "")) for r in wanted], "iteration": [int(r["iteration"]) for r in wanted]}
        )
        others = [c for c in self.feature_columns if c not in self.sup_models]
        missing = [c for c in others if any(c not in r for r in wanted)]
        if missing:
            if self.feature_extractor is None:
                raise ValueError(f"rows lack features {missing} and the bundle has no feature_extractor")
            extracted = {int(f["iteration"]): f for f in self.feature_extractor(rows, question)}
            for c in others:
                frame[c] = [extracted.get(int(r["iteration"]), {}).get(c) for r in wanted]
        else:
            for c in others:
                frame[c] = [r[c] for r in wanted]
        for column, values in self._supervised(rows, wanted, question).items():
            frame[column] = values
        for c in self.feature_columns:
            frame[c] = pd.to_numeric(frame[c], errors="coerce")
        return frame

    def _supervised(self, rows, wanted, question: str) -> dict[str, list[float]]:
        """Cross-encoder signals for the wanted iterations, cached per (qid, iteration, column)."""
        from raypipe.predict.crossencoder import load_crossencoder, predict_texts

        qid = str(rows[-1].get("qid", ""))
        needed = {int(r["iteration"]) for r in wanted}
        texts = dict(trajectory_texts(question, list(rows), lookup_top_doc(self.doc_lookup), self.reasoning_text))
        out = {}
        for column, folder in self.sup_models.items():
            if column not in self.feature_columns:
                continue
            relation = _relation_of(column)
            todo = [i for i in sorted(needed) if (qid, i, column) not in self._sup_cache]
            if todo:
                if column not in self._encoders:
                    self._encoders[column] = load_crossencoder(self.root / folder)
                inputs = [format_relation(relation, texts[i], self.field_chars, self.title_chars) for i in todo]
                for i, value in zip(todo, predict_texts(self._encoders[column], inputs, self.max_tokens)):
                    self._sup_cache[(qid, i, column)] = float(value)
            out[column] = [self._sup_cache[(qid, int(r["iteration"]), column)] for r in wanted]
        return out


def _relation_of(column: str) -> str:
    """sup_<target>_<short relation> -> relation name."""
    short = column.rsplit("_", 1)[-1]
    return next(rel for rel, s in SHORT.items() if s == short)
