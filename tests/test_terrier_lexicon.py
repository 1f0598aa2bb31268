"""The Terrier lexicon (the seed's NQC lookup) and the memory-mapped document-frequency tables.

References are terrier-core at commit 3ceec7d89cb943a56e4bf298b00897d4221d0002:
``modules/core/src/main/java/org/terrier/indexing/tokenisation/EnglishTokeniser.java`` (EnglishTokeniser.java),
``modules/core/src/main/java/org/terrier/terms/Stopwords.java`` and ``share/stopword-list.txt``."""

import hashlib
from collections import Counter
from importlib import resources

import pytest

from raypipe.data.loaders import BUNDLED_CORPUS, Passage, iter_corpus
from raypipe.retrieval import terrier
from raypipe.retrieval.store import (
    LEXICONS,
    CorpusStats,
    FrequencyMerger,
    MissingLexiconError,
    document_frequencies,
    passage_terms,
)
from raypipe.retrieval.termtable import TermTable


def test_tokens_are_runs_of_ascii_letters_and_digits():
    """EnglishTokeniser.java lines 107-126: any character but A-Z, a-z, 0-9 ends a token (so a non-ASCII
    letter splits a word, as TestEnglishTokeniser's ``a\\u0133a`` -> a, a)."""
    assert terrier.index_terms("hello.wolf-mr/ABBA, café naïve") == {"hello", "wolf", "mr", "abba", "caf", "na", "ve"}


@pytest.mark.parametrize(
    "token, kept",
    [
        ("abcdefghijklmnopqrst", "abcdefghijklmnopqrst"),  # 20 characters: kept (max.term.length, lines 127-129)
        ("thisisareallylongword", None),  # 21: dropped (TestEnglishTokeniser.testMulipleLongTerms)
        ("0a000", "0a000"),  # 4 digits kept, 5 dropped (check(), lines 166-180; TestEnglishTokeniser.testCheckTerms)
        ("0a0000", None),
        ("12345", None),
        ("bbb", "bbb"),  # 3 identical characters in a row kept, 4 dropped (lines 171-180)
        ("bbbb", None),
        ("Aaaa", "aaaa"),  # compared before lowercasing (line 182), so A-a-a-a is no run of 4
        ("WOLF", "wolf"),  # lowercased (line 182)
    ],
)
def test_check_keeps_and_drops_as_terrier(token, kept):
    """EnglishTokeniser.java ``check()`` (lines 157-183) and the length rule of ``next()`` (lines 127-129)."""
    assert terrier.check(token) == kept


def test_stopwords_are_terriers_default_list_unchanged():
    """``share/stopword-list.txt`` (= ``modules/core/src/main/resources/stopword-list.txt``, loaded by
    ``org/terrier/terms/Stopwords.java`` line 70; trimmed non-empty lines, lines 131-138)."""
    data = resources.files("raypipe.retrieval").joinpath("data/terrier-stopword-list.txt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "e898516899c485739ca1fef24f6b2590ecf95cd06ba22e66587f64b079610999"
    assert len(terrier.STOPWORDS) == 733 and {"the", "and", "a", "were", "there"} <= terrier.STOPWORDS
    assert terrier.index_terms("The and THERE were a") == set()  # removed after lowercasing, before stemming


def test_terms_are_porter_stems_of_the_kept_tokens():
    """Terrier's term pipeline ``Stopwords,PorterStemmer`` (PyTerrier's IterDictIndexer default)."""
    assert terrier.index_terms("The cities were running in 1990 and 12345") == {"citi", "run", "1990"}
    assert passage_terms("Paris", "Cities of the world", "terrier") == {"pari", "citi", "world"}
    assert passage_terms("Paris", "Cities of the world") == {"paris", "cities", "of", "the", "world"}


@pytest.fixture(scope="module")
def bundled():
    return list(iter_corpus(BUNDLED_CORPUS))


@pytest.mark.slow
def test_mapped_tables_equal_a_dict_on_the_bundled_corpus(bundled, tmp_path):
    """Both lexicons over the 13,844 bundled passages, counted in blocks, merged, written and mapped, look
    up the same document frequencies as a dict counted directly."""
    merger = FrequencyMerger(fold_every=3)
    for start in range(0, len(bundled), 1000):
        merger.add(*document_frequencies(bundled[start : start + 1000]))
    sizes = merger.write(tmp_path)
    stats = CorpusStats.read(tmp_path)
    assert stats.n_docs == len(bundled)
    for lexicon in LEXICONS:
        expected = Counter(t for p in bundled for t in passage_terms(p.title, p.text, lexicon))
        assert sizes[lexicon] == len(expected) == len(stats.tables[lexicon])
        assert all(stats.df(term, lexicon) == df for term, df in expected.items()), lexicon
        assert stats.df("zzzunseen", lexicon) == 0 and stats.df("", lexicon) == 0
    assert stats.df("pari", "terrier") > 0 and stats.df("Pari", "terrier") == 0 and stats.df("the", "plain") > 0


def test_term_table_lookup_edges(tmp_path):
    table = TermTable.from_counts({"b": 2, "a": 1, "é": 3, "zz": 4, "a b": 5}, {"n_docs": "9"})
    table.write(tmp_path / "t.arrow")
    mapped = TermTable.read(tmp_path / "t.arrow")
    for t in (table, mapped):
        assert [t.get(x) for x in ("a", "a b", "b", "é", "zz", "", "aa", "zzz", "c")] == [1, 5, 2, 3, 4, 0, 0, 0, 0]
    assert mapped.metadata == {"n_docs": "9"} and TermTable.from_counts({}).get("a") == 0


def test_counted_stats_answer_both_lexicons_and_name_a_missing_one():
    stats = CorpusStats.count([Passage("a", "Cat", "cats cat dog"), Passage("b", "Dog", "the dogs")])
    assert (stats.df("cat"), stats.df("cats"), stats.df("dog"), stats.df("dogs"), stats.n_docs) == (1, 1, 2, 1, 2)
    assert stats.document_frequencies(["cat", "dog", "the"], "terrier") == [1, 2, 0]
    with pytest.raises(ValueError, match="unknown lexicon"):
        stats.df("cat", "bm25")
    old = CorpusStats({"plain": stats.tables["plain"]}, 2, "index /x")
    with pytest.raises(MissingLexiconError, match=r"index /x has no 'terrier' .*df_terrier.arrow.*`raypipe index`"):
        old.df("cat", "terrier")
