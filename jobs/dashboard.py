"""Entry point of the dashboard job for ``python jobs/dashboard.py``.

The job lives in :mod:`raypipe.stages.dashboard` (``raypipe dashboard --help`` lists its options).
"""

from raypipe.stages.dashboard import main

if __name__ == "__main__":
    main()
