"""Entry point of the probe job for ``python jobs/probe.py`` and ``ray job submit -- python jobs/probe.py``.

The job lives in :mod:`raypipe.stages.probe` (``raypipe probe --help`` lists its options).
"""

from raypipe.stages.probe import main

if __name__ == "__main__":
    main()
