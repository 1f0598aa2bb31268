"""Entry point of the sweep job for ``python jobs/sweep.py`` and ``ray job submit -- python jobs/sweep.py``.

The job lives in :mod:`raypipe.stages.sweep` (``raypipe sweep --help`` lists its options).
"""

from raypipe.stages.sweep import main

if __name__ == "__main__":
    main()
