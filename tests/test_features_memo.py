"""The controller's memories: a decision per iteration over a growing history gives the signals of a plain
extraction, while the encoders and the index see each text, document and search once."""

import numpy as np

from raypipe.features.extract import extract_many
from raypipe.features.memo import MemoCorpus, MemoSentences
from tests.test_features_extract import SENTENCES, CountingCorpus, DictEncoder, corpus, trajectory  # noqa: F401


class RecordingEncoder(DictEncoder):
    def __init__(self, table):
        super().__init__(table)
        self.seen = []

    def encode(self, texts):
        self.seen += list(texts)
        return super().encode(texts)


def test_growing_histories_match_plain_extraction_and_encode_each_input_once(corpus):  # noqa: F811
    rows, question = trajectory(), "Who wrote Hamlet?"
    encoder, counting = RecordingEncoder(SENTENCES), CountingCorpus(corpus)
    sentences, memo_corpus = MemoSentences(encoder), MemoCorpus(counting)
    for n in range(1, len(rows) + 1):
        remembered = extract_many([(rows[:n], question)], memo_corpus, sentences)
        assert remembered == extract_many([(rows[:n], question)], corpus, DictEncoder(SENTENCES))
    assert sorted(encoder.seen) == sorted(set(encoder.seen))  # no text encoded twice
    assert counting.calls["search"] == 1  # the question's own list, searched once


def test_a_memory_keeps_its_most_recent_entries():
    encoder = RecordingEncoder({"a": [1.0], "b": [2.0], "c": [3.0]})
    sentences = MemoSentences(encoder, capacity=2)
    sentences.encode(["a", "b"])
    sentences.encode(["a", "c"])  # "b" is the oldest: forgotten
    assert np.array_equal(sentences.encode(["b", "a"]), [[2.0], [1.0]])
    assert encoder.seen == ["a", "b", "c", "b"]
