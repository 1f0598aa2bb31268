"""Entry point of the stoprag job for ``python jobs/stoprag.py`` and ``ray job submit -- python jobs/stoprag.py``.

The job lives in :mod:`raypipe.stages.stoprag` (``raypipe stoprag --help`` lists its options).
"""

from raypipe.stages.stoprag import main

if __name__ == "__main__":
    main()
