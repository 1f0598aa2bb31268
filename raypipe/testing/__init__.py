"""Fakes that ship with the package, for tests of code built on raypipe and for the project's benchmarks.

- :mod:`raypipe.testing.fakes`: a scripted engine, a retriever over generated hits and a scripted stop
  controller, for testing your own agent, controller, engine wrapper or retriever against the protocols
  without a model or an index.
- :mod:`raypipe.testing.http_faults`: a loopback HTTP server whose answers a script decides (slow, garbage,
  refused, hung up), for testing a client of a retrieval service (``benchmarks/service_faults.py``).
- :mod:`raypipe.testing.synthetic`: a synthetic run directory and stand-in features resources (a hash
  encoder, an in-memory corpus), for the features stage without models (``benchmarks/features.py``).

Nothing in the pipeline imports this package. The project's own test support (fault cases, fixtures,
local clusters, tiny models) lives with the tests, in ``tests/helpers/``.
"""
