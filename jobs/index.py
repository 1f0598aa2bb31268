"""Entry point of the index job for ``python jobs/index.py`` and ``ray job submit -- python jobs/index.py``.

The job lives in :mod:`raypipe.stages.index` (``raypipe index --help`` lists its options).
"""

from raypipe.stages.index import main

if __name__ == "__main__":
    main()
