"""Notebook command for crash tests: wait $COMPOSE_TEST_LAUNCH_DELAY s, then run the notebook.

It holds a spawn in its launch step (machine composed, notebook not answering
yet) long enough for a test to kill the hub there.
"""

import os
import sys
import time
from pathlib import Path

time.sleep(float(os.environ.get("COMPOSE_TEST_LAUNCH_DELAY", "0")))  # the hold is the point
notebook = str(Path(sys.executable).parent / "jupyterhub-singleuser")
os.execv(notebook, [notebook, *sys.argv[1:]])
