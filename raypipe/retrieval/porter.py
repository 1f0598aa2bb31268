"""The Porter stemmer as Terrier runs it (the seed paper's NQC looks query terms up with it, and
Terrier's indexing stems the lexicon's terms with it, :mod:`raypipe.retrieval.terrier`).

Martin Porter's reference implementation of his 1980 algorithm, as Terrier ships it
(terrier-core ``modules/core/src/main/java/org/terrier/terms/PorterStemmer.java``): the two
departures of Porter's own code from the paper (``bli -> ble`` instead of ``abli -> able``, and
``logi -> log``), words of one or two characters left alone, and no lowercasing: only the lowercase
letters a, e, i, o, u (and y after a consonant) are vowels, so ``"Paris"`` stems to ``"Pari"`` and an
upper-case letter counts as a consonant. PyTerrier's ``TerrierStemmer.porter.stem`` calls that class.
"""

from __future__ import annotations

_VOWELS = frozenset("aeiou")

# Step 2 and step 3: (suffix, replacement) tried in order; the first suffix the word ends with decides,
# and it is replaced only when the stem before it has m > 0.
_STEP2 = (
    ("ational", "ate"),
    ("tional", "tion"),
    ("enci", "ence"),
    ("anci", "ance"),
    ("izer", "ize"),
    ("bli", "ble"),
    ("alli", "al"),
    ("entli", "ent"),
    ("eli", "e"),
    ("ousli", "ous"),
    ("ization", "ize"),
    ("ation", "ate"),
    ("ator", "ate"),
    ("alism", "al"),
    ("iveness", "ive"),
    ("fulness", "ful"),
    ("ousness", "ous"),
    ("aliti", "al"),
    ("iviti", "ive"),
    ("biliti", "ble"),
    ("logi", "log"),
)
_STEP3 = (("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""), ("ness", ""))
# Step 4: suffixes removed when the stem before them has m > 1 (``ion`` only after s or t).
_STEP4 = (
    "al",
    "ance",
    "ence",
    "er",
    "ic",
    "able",
    "ible",
    "ant",
    "ement",
    "ment",
    "ent",
    "ion",
    "ou",
    "ism",
    "ate",
    "iti",
    "ous",
    "ive",
    "ize",
)


def _consonant(word: str, i: int) -> bool:
    ch = word[i]
    if ch in _VOWELS:
        return False
    if ch == "y":
        return i == 0 or not _consonant(word, i - 1)
    return True


def _measure(stem: str) -> int:
    """m: the number of vowel-consonant sequences in ``stem`` ([C](VC)^m[V])."""
    m, previous_vowel = 0, False
    for i in range(len(stem)):
        vowel = not _consonant(stem, i)
        if previous_vowel and not vowel:
            m += 1
        previous_vowel = vowel
    return m


def _has_vowel(stem: str) -> bool:
    return any(not _consonant(stem, i) for i in range(len(stem)))


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _consonant(word, len(word) - 1)


def _cvc(word: str) -> bool:
    """Ends consonant-vowel-consonant, the last consonant not w, x or y (hop(e), not snow)."""
    n = len(word)
    return (
        n >= 3
        and _consonant(word, n - 1)
        and not _consonant(word, n - 2)
        and _consonant(word, n - 3)
        and word[-1] not in "wxy"
    )


def _step1(word: str) -> str:
    if word.endswith("s"):
        if word.endswith(("sses", "ies")):
            word = word[:-2]
        elif not word.endswith("ss"):
            word = word[:-1]
    if word.endswith("eed"):
        return word[:-1] if _measure(word[:-3]) > 0 else word
    for suffix in ("ed", "ing"):
        if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
            word = word[: -len(suffix)]
            if word.endswith(("at", "bl", "iz")):
                return word + "e"
            if _double_consonant(word):
                return word if word[-1] in "lsz" else word[:-1]
            if _measure(word) == 1 and _cvc(word):
                return word + "e"
            return word
    return word


def _replace_first(word: str, rules: tuple[tuple[str, str], ...], min_measure: int) -> str:
    for suffix, replacement in rules:
        if word.endswith(suffix):
            stem = word[: -len(suffix)]
            return stem + replacement if _measure(stem) > min_measure else word
    return word


def _step4(word: str) -> str:
    for suffix in _STEP4:
        if word.endswith(suffix):
            stem = word[: -len(suffix)]
            if suffix == "ion" and not stem.endswith(("s", "t")):
                return word
            return stem if _measure(stem) > 1 else word
    return word


def _step5(word: str) -> str:
    if word.endswith("e"):
        m = _measure(word[:-1])
        if m > 1 or (m == 1 and not _cvc(word[:-1])):
            word = word[:-1]
    if word.endswith("l") and _double_consonant(word) and _measure(word) > 1:
        word = word[:-1]
    return word


def stem(word: str) -> str:
    """``word``'s Porter stem, exactly as Terrier's ``PorterStemmer.stem(String)`` computes it."""
    if len(word) <= 2:
        return word
    word = _step1(word)
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    word = _replace_first(word, _STEP2, 0)
    word = _replace_first(word, _STEP3, 0)
    return _step5(_step4(word))
