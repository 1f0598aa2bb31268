"""Trajectory signals: QPP (``qpp``), list overlap / RBO (``overlap``), text similarity (``similarity``),
probe confidence (``confidence``), and ``extract``, which turns one trajectory's iteration rows into
feature rows; ``resources`` holds what they read from outside (the retrieval index, the sentence encoder).
Plain Python; the Ray adapter is ``raypipe.stages.features``."""
