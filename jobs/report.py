"""Entry point of the report job for ``python jobs/report.py`` and ``ray job submit -- python jobs/report.py``.

The job lives in :mod:`raypipe.stages.report` (``raypipe report --help`` lists its options).
"""

from raypipe.stages.report import main

if __name__ == "__main__":
    main()
