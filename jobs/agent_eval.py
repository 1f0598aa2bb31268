"""Entry point of the agent-eval job for ``python jobs/agent_eval.py`` and
``ray job submit -- python jobs/agent_eval.py``.

The job lives in :mod:`raypipe.stages.agent_eval` (``raypipe agent-eval --help`` lists its options).
"""

from raypipe.stages.agent_eval import main

if __name__ == "__main__":
    main()
