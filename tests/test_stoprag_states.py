"""Stop-RAG states as the Q-network reads them: tokenised, cut to the encoder's limit, pairwise different.

Reference: chosolbee/MHQA-SetVerify ``Training/multihead_stop_decider_train.py`` (l.52-79: the state text,
the tokenizer call; l.541: ``--max-length 2048``), ``Training/utils.py`` l.15-24, ``pipeline/pipeline_sep.py``
l.77-94 (one selected document per iteration).
"""

import functools
import itertools
import random

import pytest

torch = pytest.importorskip("torch")

from raypipe.core.models import resolve_sentence_model  # noqa: E402
from raypipe.data.loaders import BUNDLED_CORPUS, iter_corpus, load_questions  # noqa: E402
from raypipe.stoprag.qnet import (  # noqa: E402
    REFERENCE_MAX_LENGTH,
    encode_states,
    encoder_max_length,
    load_tokenizer,
    truncate_ids,
)
from raypipe.stoprag.targets import build_episode, with_documents  # noqa: E402

MAX_ITERATIONS = 10  # pyterrier-rag's turn limit: the longest trajectories the seed's runs have
TOP_K = 3  # documents the agent sees per search (the seed's setup)


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return load_tokenizer(resolve_sentence_model("minilm"))


def test_truncation_keeps_the_question_and_the_newest_tokens():
    """The default cut drops the oldest document tokens but keeps their separators; ``start`` is the
    tokenizer's cut at the end that the reference calls (multihead_stop_decider_train.py l.73-79)."""
    cls, sep = 101, 102
    ids = [cls, 7, 8, sep, *range(20, 40), sep]  # [CLS] question [SEP] documents [SEP]
    cut = truncate_ids(ids, 10, sep)
    assert cut == [cls, 7, 8, sep, 35, 36, 37, 38, 39, sep] and len(cut) == 10
    assert truncate_ids(ids, 10, sep, keep="start") == [cls, 7, 8, sep, 20, 21, 22, 23, 24, sep]
    assert truncate_ids(ids, 40, sep) == ids  # short enough: untouched
    parts = [cls, 7, sep, 1, 1, 1, sep, 2, 2, 2, sep, 3, 3, 3, sep]  # three documents
    assert truncate_ids(parts, 9, sep) == [cls, 7, sep, sep, sep, 3, 3, 3, sep]  # the dropped one leaves its separator
    assert truncate_ids(parts, 9, sep).count(sep) == parts.count(sep)
    long_question = [cls, *range(50, 70), sep, 1, 2, sep]
    cut = truncate_ids(long_question, 10, sep)  # the question takes half the budget at most
    assert cut[:5] == [cls, 50, 51, 52, sep] and cut[-3:] == [1, 2, sep] and len(cut) == 10


def test_encoder_max_length_is_the_longest_accepted_input(tmp_path, minilm_tokenizer):
    """MiniLM accepts 512 tokens; an encoder without absolute positions (DeBERTa-v3's relative attention)
    gets the reference's 2048 (l.541)."""
    from transformers import BertConfig

    assert encoder_max_length(resolve_sentence_model("minilm")) == 512
    minilm_tokenizer.save_pretrained(tmp_path)
    config = BertConfig(max_position_embeddings=128)
    config.save_pretrained(tmp_path)
    assert encoder_max_length(tmp_path) == 128
    config.position_biased_input = False  # relative positions only
    config.save_pretrained(tmp_path)
    unbounded = load_tokenizer(tmp_path)
    unbounded.model_max_length = int(1e30)
    unbounded.save_pretrained(tmp_path)
    assert encoder_max_length(tmp_path) == REFERENCE_MAX_LENGTH


@functools.cache
def bundled_histories(per_dataset: int = 40, seed: int = 0) -> list[tuple[str, str, list[dict]]]:
    """Trajectories as a real run records them, from the bundled questions and their own paragraphs: up to
    ten searches, each returning TOP_K of the question's paragraphs in a shifting order (so later searches
    return documents already seen, as agents re-finding the same pages do), with repeated queries (every
    document already seen) and probe answers."""
    paragraphs = {p.doc_id: (p.title, p.text) for p in iter_corpus(BUNDLED_CORPUS)}
    rng = random.Random(seed)
    out = []
    for dataset in ("hotpotqa", "2wikimultihopqa", "musique"):
        for q in load_questions(dataset, limit=per_dataset):
            pool = [p for p in q.extra["paragraph_ids"] if p in paragraphs]
            n = rng.randint(1, MAX_ITERATIONS)
            rows = [{"qid": q.qid, "iteration": 0, "query": None, "doc_ids": [], "probe_answer": "x", "probe_f1": 0.0}]
            ranked: list[str] = []
            for i in range(1, n + 1):
                if i == 1 or rng.random() > 0.25:  # else: the same query again, the same documents
                    start = rng.randrange(len(pool))
                    ranked = [pool[(start + k) % len(pool)] for k in range(TOP_K + 2)]
                rows.append(
                    {
                        "qid": q.qid,
                        "iteration": i,
                        "query": f"query {i}",
                        "doc_ids": ranked,
                        "probe_answer": "x",
                        "probe_f1": 0.0,
                    }
                )
            out.append((q.qid, q.question, with_documents(rows, paragraphs, TOP_K)))
    return out


def _duplicate_states(tokenizer, max_length: int, keep: str) -> tuple[int, int, int]:
    """(trajectories with two identical tokenised states, states, states cut) over the bundled histories."""
    bad = states = cut = 0
    for qid, question, rows in bundled_histories():
        episode = build_episode(qid, question, rows, sep=tokenizer.sep_token)
        full = tokenizer(list(episode.texts), verbose=False)["input_ids"]
        cut += sum(len(ids) > max_length for ids in full)
        encoded = encode_states(tokenizer, episode.texts, max_length, keep)
        rows_ = [tuple(r[m.bool()].tolist()) for r, m in zip(encoded["input_ids"], encoded["attention_mask"])]
        assert all(len(r) <= max_length for r in rows_)
        states += len(rows_)
        bad += any(a == b for a, b in itertools.combinations(rows_, 2))
    return bad, states, cut


def test_bundled_trajectories_have_pairwise_different_states(minilm_tokenizer):
    """For every trajectory built from the bundled questions the tokenised inputs of s_1..s_T differ pairwise,
    at MiniLM's 512 tokens and at a 128-token encoder, although many states are cut; the reference's own
    cut at the end (``start``) makes states identical once the documents pass the limit."""
    bad, states, cut = _duplicate_states(minilm_tokenizer, 512, "newest")
    assert states > 300 and cut > 20  # the test exercises the cut
    assert bad == 0
    bad, _, cut = _duplicate_states(minilm_tokenizer, 128, "newest")
    assert cut > states // 2 and bad == 0
    for max_length in (512, 128):  # what the default avoids (measured: 49 and 91 of the 120 trajectories)
        assert _duplicate_states(minilm_tokenizer, max_length, "start")[0] > 20
