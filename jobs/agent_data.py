"""Entry point of the agent-data job for ``python jobs/agent_data.py`` and
``ray job submit -- python jobs/agent_data.py``.

The job lives in :mod:`raypipe.stages.agent_data` (``raypipe agent-data --help`` lists its options).
"""

from raypipe.stages.agent_data import main

if __name__ == "__main__":
    main()
