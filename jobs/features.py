"""Entry point of the features job for ``python jobs/features.py`` and ``ray job submit -- python jobs/features.py``.

The job lives in :mod:`raypipe.stages.features` (``raypipe features --help`` lists its options).
"""

from raypipe.stages.features import main

if __name__ == "__main__":
    main()
