"""Notebook command for tests: servers named fail* exit at once, others run the real notebook.

A boundary fake for "the launch failed": everything else about the spawn is real.
"""

import os
import sys
from pathlib import Path

if os.environ.get("JUPYTERHUB_SERVER_NAME", "").startswith("fail"):
    sys.exit(3)
notebook = str(Path(sys.executable).parent / "jupyterhub-singleuser")
os.execv(notebook, [notebook, *sys.argv[1:]])
