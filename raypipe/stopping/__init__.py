"""Prediction-guided early stopping: offline replay, fixed caps, the 4-state heuristic, the online controller."""
