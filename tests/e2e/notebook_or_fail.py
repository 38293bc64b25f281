"""Notebook command for tests: servers named fail* exit at once, hang* never answer, others
run the real notebook.

A boundary fake for "the launch failed": everything else about the spawn is real.
"""

import os
import sys
import time
from pathlib import Path

server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
if server.startswith("fail"):
    sys.exit(3)
if server.startswith("hang"):
    while True:  # up, but never listening: the start must time out
        time.sleep(3600)
notebook = str(Path(sys.executable).parent / "jupyterhub-singleuser")
os.execv(notebook, [notebook, *sys.argv[1:]])
