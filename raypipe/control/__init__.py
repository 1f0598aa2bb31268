"""Stopping controllers: the 4-state heuristic, caps, Stop-RAG, LLM-Stop, and the online hook."""
