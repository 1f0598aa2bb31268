"""E5-style dense retrieval over FAISS: encoders, index build/load, and the retrieval service."""
