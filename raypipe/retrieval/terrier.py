"""The terms Terrier's default English indexing stores for a text (the seed's lexicon, ``terrier``).

PyTerrier's default ``IterDictIndexer`` (stemmer ``porter``, stopwords ``terrier``) runs Terrier's
``EnglishTokeniser``, then the term pipeline ``Stopwords,PorterStemmer``. Each rule below follows
terrier-core at commit 3ceec7d89cb943a56e4bf298b00897d4221d0002:

- ``modules/core/src/main/java/org/terrier/indexing/tokenisation/EnglishTokeniser.java``:
  a token is a maximal run of ASCII letters and digits, any other character ends it (lines 107-126);
  a token longer than ``max.term.length`` (20, ``ApplicationSetup.java`` line 471) is dropped (lines
  127-129); ``check()`` (lines 157-183) drops a token with more than 4 digits or more than 3 identical
  consecutive characters (compared before lowercasing, case-sensitively), then lowercases it.
- ``modules/core/src/main/java/org/terrier/terms/Stopwords.java``: the default list is
  ``resource:/stopword-list.txt`` (line 70), read a trimmed non-empty line per word (lines 131-138);
  a term in it is not indexed (lines 171-175). The list is shipped unchanged as
  ``data/terrier-stopword-list.txt`` (MPL 1.1, see the ``.NOTICE`` file next to it).
- ``modules/core/src/main/java/org/terrier/terms/PorterStemmer.java``: :mod:`raypipe.retrieval.porter`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

from raypipe.retrieval import porter

MAX_TERM_LENGTH = 20
MAX_DIGITS = 4
MAX_SAME_RUN = 3

_TOKEN = re.compile(r"[A-Za-z0-9]+")
# MAX_SAME_RUN + 1 identical characters in a row (%-formatted: an f-string would have to double the regex's braces)
_SAME_RUN = re.compile(r"(.)\1{%d}" % MAX_SAME_RUN)  # noqa: UP031
STOPWORDS = frozenset(
    word.strip()
    for word in resources.files("raypipe.retrieval")
    .joinpath("data/terrier-stopword-list.txt")
    .read_text("utf-8")
    .splitlines()
    if word.strip()
)


def check(token: str) -> str | None:
    """An ASCII alphanumeric token as Terrier keeps it (lowercased), or None if Terrier drops it."""
    if len(token) > MAX_TERM_LENGTH or sum(ch.isdigit() for ch in token) > MAX_DIGITS or _SAME_RUN.search(token):
        return None
    return token.lower()


@lru_cache(maxsize=1 << 17)  # per distinct token: the stemmer is pure Python, and tokens repeat (Zipf)
def _term(token: str) -> str | None:
    word = check(token)
    return None if word is None or word in STOPWORDS else porter.stem(word)


def index_terms(text: str) -> set[str]:
    """The distinct terms Terrier indexes for ``text``: its tokens (maximal runs of ASCII letters and
    digits) that :func:`check` keeps and that are not stopwords, Porter-stemmed."""
    terms = set(map(_term, set(_TOKEN.findall(text))))
    terms.discard(None)
    return terms
