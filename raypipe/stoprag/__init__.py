"""Stop-RAG (value-based stopping with Q(lambda) targets) and the LLM-Stop baseline."""
