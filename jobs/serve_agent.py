"""Entry point of the serve-agent job for ``python jobs/serve_agent.py`` and
``ray job submit -- python jobs/serve_agent.py``.

The job lives in :mod:`raypipe.stages.serve_agent` (``raypipe serve-agent --help`` lists its options).
"""

from raypipe.stages.serve_agent import main

if __name__ == "__main__":
    main()
