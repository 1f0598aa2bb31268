"""The probe job the driver-interrupt case signals: ``python -m tests.helpers.chaos_job OUT_DIR DELAY_S``
(from the repository root).

Fakes only (tests/helpers/chaos.py ``fake_probe``), each agent turn slowed by DELAY_S seconds so the job
is still running when its first part lands.
"""

import signal
import sys
from pathlib import Path

from tests.helpers.chaos import fake_probe
from tests.helpers.local_ray import init_local_ray

if __name__ == "__main__":
    # A shell starts background commands with SIGINT ignored, and children inherit that; the case
    # stands for a user's Ctrl-C, so the job gets Python's usual KeyboardInterrupt whoever started it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    init_local_ray()
    fake_probe(Path(sys.argv[1]), delay_s=float(sys.argv[2]))
