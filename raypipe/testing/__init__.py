"""Test helpers shared by ``tests/`` and ``benchmarks/``: fake engines and retrievers, fault injection,
local Ray clusters, the reliability (chaos) cases, tiny models and index checks.

Nothing in the pipeline imports this package; it is part of the package so that tests and benchmarks
import it the same way, with no path tricks.
"""
