"""Entry point of the tune-agent job for ``python jobs/tune_agent.py`` and
``ray job submit -- python jobs/tune_agent.py``.

The job lives in :mod:`raypipe.stages.tune_agent` (``raypipe tune-agent --help`` lists its options).
"""

from raypipe.stages.tune_agent import main

if __name__ == "__main__":
    main()
