"""The local Ray the Ray tests run on (the ``ray_local`` fixture of tests/conftest.py, the chaos job)."""

from __future__ import annotations


def ship_tests_by_value() -> None:
    """Make everything under ``tests`` travel to Ray's workers by value.

    Workers import by reference only what is on their ``sys.path`` (the installed packages and the driver's
    working directory) and pytest may run from anywhere, so the test modules and their helpers (scripted
    engine factories, faults, Train loops) go with what pickles them. Call it before a test's objects are
    sent to Ray, whoever starts Ray.
    """
    from ray import cloudpickle

    import tests

    cloudpickle.register_pickle_by_value(tests)


def init_local_ray() -> None:
    """A local 2-CPU Ray (its dashboard off, its workers' logs kept off the test output) that receives the
    tests' objects by value."""
    import ray

    ship_tests_by_value()
    ray.init(num_cpus=2, object_store_memory=300_000_000, include_dashboard=False, log_to_driver=False)
