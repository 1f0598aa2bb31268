"""The Porter stemmer the seed's NQC lookup uses (Terrier's PorterStemmer), against published outputs."""

import json
import re
from importlib import resources

import pytest

from raypipe.retrieval.porter import stem

# Porter (1980), "An algorithm for suffix stripping", the examples of each step, and the examples in the
# comments of terrier-core modules/core/src/main/java/org/terrier/terms/PorterStemmer.java (step1).
PUBLISHED = {
    # step 1a / 1b / 1c
    "caresses": "caress",
    "ponies": "poni",
    "ties": "ti",
    "caress": "caress",
    "cats": "cat",
    "feed": "feed",
    "agreed": "agre",
    "plastered": "plaster",
    "bled": "bled",
    "motoring": "motor",
    "sing": "sing",
    "conflated": "conflat",
    "troubled": "troubl",
    "sized": "size",
    "hopping": "hop",
    "tanned": "tan",
    "falling": "fall",
    "hissing": "hiss",
    "fizzed": "fizz",
    "failing": "fail",
    "filing": "file",
    "happy": "happi",
    "sky": "sky",
    "matting": "mat",
    "mating": "mate",
    "meeting": "meet",
    "milling": "mill",
    "messing": "mess",
    "meetings": "meet",
    "disabled": "disabl",
    # step 2 (with Porter's own departures: bli -> ble, logi -> log)
    "relational": "relat",
    "conditional": "condit",
    "rational": "ration",
    "valenci": "valenc",
    "hesitanci": "hesit",
    "digitizer": "digit",
    "conformabli": "conform",
    "radicalli": "radic",
    "differentli": "differ",
    "vileli": "vile",
    "analogousli": "analog",
    "vietnamization": "vietnam",
    "predication": "predic",
    "operator": "oper",
    "feudalism": "feudal",
    "decisiveness": "decis",
    "hopefulness": "hope",
    "callousness": "callous",
    "formaliti": "formal",
    "sensitiviti": "sensit",
    "sensibiliti": "sensibl",
    "archaeology": "archaeolog",
    # step 3
    "triplicate": "triplic",
    "formative": "form",
    "formalize": "formal",
    "electriciti": "electr",
    "electrical": "electr",
    "hopeful": "hope",
    "goodness": "good",
    # step 4
    "revival": "reviv",
    "allowance": "allow",
    "inference": "infer",
    "airliner": "airlin",
    "gyroscopic": "gyroscop",
    "adjustable": "adjust",
    "defensible": "defens",
    "irritant": "irrit",
    "replacement": "replac",
    "adjustment": "adjust",
    "dependent": "depend",
    "adoption": "adopt",
    "homologou": "homolog",
    "communism": "commun",
    "activate": "activ",
    "angulariti": "angular",
    "homologous": "homolog",
    "effective": "effect",
    "bowdlerize": "bowdler",
    # step 5
    "probate": "probat",
    "rate": "rate",
    "cease": "ceas",
    "controll": "control",
    "roll": "roll",
    # words of one or two characters are left alone; nothing is lowercased (upper case is a consonant)
    "is": "is",
    "as": "as",
    "Paris": "Pari",
    "Hamlet": "Hamlet",
    "GREATLY": "GREATLY",
    "play?": "play?",
}


@pytest.mark.parametrize("word, expected", sorted(PUBLISHED.items()))
def test_published_examples(word, expected):
    """Porter's paper and Terrier's PorterStemmer.java: the stemmer the seed's ``QPPCalculator._max_idf``
    (``predictions/unsupervised/qpp/calculator.py`` lines 37-58, ``pt.TerrierStemmer.porter``) applies."""
    assert stem(word) == expected


def test_same_as_nltk_martin_extensions_on_the_bundled_corpus():
    """NLTK's PorterStemmer in MARTIN_EXTENSIONS mode is Porter's own implementation (Terrier's); checked
    on the bundled corpus's words as they are (case and punctuation kept); nltk is a test dependency."""
    from nltk.stem import porter

    reference = porter.PorterStemmer(mode=porter.PorterStemmer.MARTIN_EXTENSIONS)
    text = resources.files("raypipe.data").joinpath("mhqa/corpus.jsonl").read_text(encoding="utf-8")
    words = set()
    for line in text.splitlines()[:300]:
        for token in json.loads(line)["contents"].split():
            words.update((token, token.lower(), *re.findall(r"\w+", token.lower())))
    assert len(words) > 3000
    assert [w for w in sorted(words) if stem(w) != reference.stem(w, to_lowercase=False)] == []
