"""Reliability under faults and bad input (issue 10): the cases of tests/helpers/chaos.py, one test each.

``python benchmarks/chaos.py`` runs these tests and prints their outcomes as a table.
"""

import signal

import pytest

from tests.helpers import chaos as cases
from tests.helpers.chaos import passed
from tests.helpers.tiny_models import tiny_bert


@pytest.fixture(scope="module")
def index_config(tmp_path_factory):
    return cases.index_config(tmp_path_factory.mktemp("index"))


@pytest.fixture(scope="module")
def reference(ray_local, tmp_path_factory):
    return cases.reference_run(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def test_bad_input_fails_before_any_work(tmp_path):
    assert passed(cases.bad_input(tmp_path))


@pytest.mark.slow
def test_generation_actor_killed_mid_job(ray_local, tmp_path):
    assert passed(cases.generation_actor_killed(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(cases.KILLS))
def test_a_question_that_kills_its_engine_every_time_ends_engine_crash(reference, tmp_path, how):
    assert passed(cases.question_kills_every_time(tmp_path, reference, how))


@pytest.mark.slow
def test_retrieval_actor_killed_mid_job(ray_local, index_config, tmp_path):
    assert passed(cases.retrieval_actor_killed(tmp_path, index_config))


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(cases.REPLICA_KILLS))
def test_retrieval_replica_killed_during_a_search(ray_local, index_config, tmp_path, kind):
    assert passed(cases.retrieval_replica_killed_in_flight(tmp_path, index_config, kind))


@pytest.fixture(scope="module")
def retrieval_reference(ray_local, index_config, tmp_path_factory):
    return cases.retrieval_reference(tmp_path_factory.mktemp("retrieval-reference"), index_config)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(cases.POISON_SEARCHES))
def test_a_query_that_kills_its_replica_every_time_ends_query_crash(index_config, retrieval_reference, tmp_path, kind):
    assert passed(cases.poison_retrieval_query(tmp_path, index_config, retrieval_reference, kind))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_driver_interrupted_and_rerun_equals_an_uninterrupted_run(reference, tmp_path, sig):
    assert passed(cases.driver_interrupted(tmp_path, sig, reference))


@pytest.mark.slow
def test_long_question_and_engine_error_get_their_stop_reason(ray_local, tmp_path):
    assert passed(cases.row_faults(tmp_path))


@pytest.mark.slow
def test_broken_index_and_missing_model_fail_before_any_work(ray_local, index_config, tmp_path):
    assert passed(cases.broken_setup(tmp_path, index_config))


@pytest.mark.slow
def test_crossencoder_training_resumes_after_its_last_finished_model(ray_local, tiny_model, tmp_path):
    assert passed(cases.crossencoder_training_interrupted(tmp_path, tiny_model))


@pytest.mark.slow
def test_stoprag_training_resumes_from_its_last_checkpoint(ray_local, tiny_model, tmp_path):
    assert passed(cases.stoprag_training_interrupted(tmp_path, tiny_model))
