"""Trajectory signals: QPP (``qpp``), list overlap / RBO (``overlap``), text similarity (``similarity``),
probe confidence (``confidence``), and ``extract``, which turns one trajectory's iteration rows into
feature rows. Pure functions; the Ray adapter is ``raypipe.stages.features``."""
