"""raypipe: agentic RAG at cluster scale — probing, trajectory signals, predictors and early stopping on Ray."""

__version__ = "0.1.0"
