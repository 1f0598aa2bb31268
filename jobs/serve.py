"""Entry point of the serve-retrieval job for ``python jobs/serve.py`` and ``ray job submit -- python jobs/serve.py``.

The job lives in :mod:`raypipe.stages.serve` (``raypipe serve-retrieval --help`` lists its options).
"""

from raypipe.stages.serve import main

if __name__ == "__main__":
    main()
