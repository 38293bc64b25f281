"""Notebook command for crash tests: wait until $COMPOSE_TEST_LAUNCH_GATE exists, then run
the notebook.

It holds a spawn in its launch step (machine composed, notebook process running
but not answering) for as long as the test keeps the gate shut: across a hub
crash and restart, whatever the timing. Without the variable it runs at once.
"""

import os
import sys
import time
from pathlib import Path

gate = os.environ.get("COMPOSE_TEST_LAUNCH_GATE")
while gate and not Path(gate).exists():
    time.sleep(0.05)  # polling the gate: the condition itself
notebook = str(Path(sys.executable).parent / "jupyterhub-singleuser")
os.execv(notebook, [notebook, *sys.argv[1:]])
