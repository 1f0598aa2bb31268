"""What raypipe's HTTP services (``raypipe serve-retrieval``, ``raypipe serve-agent``) and their clients share, Ray-
and server-free: the bearer token's environment variable and the one-line messages both sides give."""

from __future__ import annotations

TOKEN_ENV = "RAYPIPE_RETRIEVAL_TOKEN"  # the bearer token the services ask for (--token's default) and the client sends


def one_line(text: str, limit: int = 300) -> str:
    """A server's words on one line (a message must reach the user as one line)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
