"""Entry point of the compare job for ``python jobs/compare.py`` and ``ray job submit -- python jobs/compare.py``.

The job lives in :mod:`raypipe.stages.compare` (``raypipe compare --help`` lists its options).
"""

from raypipe.stages.compare import main

if __name__ == "__main__":
    main()
