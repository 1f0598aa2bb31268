"""The dev split of the bundled questions (issue 43): disjoint from training and from the default run, a function
of the qids alone."""

from __future__ import annotations

import hashlib
import random

import pytest

from raypipe.core.config import load_config
from raypipe.data.loaders import BUNDLED_DATASETS, DataError, load_datasets
from raypipe.data.split import DEFAULT_RUN_LIMIT, bundled_split, run_questions, split_questions

DEV_QIDS_SHA256 = "b422e9e910ebc34193d849dcbc9854447f2e1ba1ac8af8a96661d319bf139270"  # 195 dev questions


def test_the_split_keeps_dev_and_the_default_run_out_of_training():
    config = load_config("embedded")
    split = bundled_split(config.agent_train.dev_percent)
    default, dev, train = (set(split.qids(p)) for p in ("default", "dev", "train"))
    assert default == {q.qid for q in load_datasets(config.data.datasets, config.data.limit)}  # make run's 12
    assert len(default) == 12 and not (default & dev) and not (default & train) and not (dev & train)
    assert default | dev | train == {q.qid for q in load_datasets(list(BUNDLED_DATASETS))}
    assert (len(dev), len(train)) == (195, 755)


def test_the_dev_split_is_pinned_and_independent_of_file_order():
    config = load_config("embedded")
    split = bundled_split(config.agent_train.dev_percent)
    assert hashlib.sha256(" ".join(sorted(split.qids("dev"))).encode()).hexdigest() == DEV_QIDS_SHA256
    shuffled = load_datasets(list(BUNDLED_DATASETS))
    random.Random(7).shuffle(shuffled)
    again = split_questions(shuffled, split.qids("default"), config.agent_train.dev_percent)
    assert set(again.qids("dev")) == set(split.qids("dev")) and set(again.qids("train")) == set(split.qids("train"))


def test_the_default_group_is_what_make_run_asks():
    assert load_config("embedded").data.limit == DEFAULT_RUN_LIMIT


def test_a_run_asks_one_part_of_the_split_with_data_split():
    config = load_config("embedded", ["data.limit=null", "data.split=dev"])
    split = bundled_split(config.agent_train.dev_percent)
    assert [q.qid for q in run_questions(config.data, config.agent_train.dev_percent)] == split.qids("dev")
    config = load_config("embedded", ["data.limit=2", "data.split=dev", "data.datasets=[musique]"])
    dev_musique = [q.qid for q in split.dev if q.dataset == "musique"]
    assert [q.qid for q in run_questions(config.data, config.agent_train.dev_percent)] == dev_musique[:2]
    config = load_config("embedded", ["data.split=all"])
    assert len(run_questions(config.data, config.agent_train.dev_percent)) == 12


def test_data_split_refuses_question_files(tmp_path):
    config = load_config("embedded", ["data.split=dev", f"data.datasets=[{tmp_path / 'mine.jsonl'}]"])
    with pytest.raises(DataError, match="bundled datasets only"):
        run_questions(config.data, config.agent_train.dev_percent)
