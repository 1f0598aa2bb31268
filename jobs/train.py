"""Entry point of the train job for ``python jobs/train.py`` and ``ray job submit -- python jobs/train.py``.

The job lives in :mod:`raypipe.stages.train` (``raypipe train --help`` lists its options).
"""

from raypipe.stages.train import main

if __name__ == "__main__":
    main()
