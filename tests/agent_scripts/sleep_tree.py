"""A command agent that never ends: it starts a child that starts a grandchild, all sleeping.

Writes the three pids, one per line, to $PIDS_FILE once all are running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "--child":
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(grandchild.pid, flush=True)
    time.sleep(600)
    sys.exit(0)

child = subprocess.Popen([sys.executable, __file__, "--child"], stdout=subprocess.PIPE, text=True)
grandchild_pid = child.stdout.readline().strip()
partial = os.environ["PIDS_FILE"] + ".partial"
with open(partial, "w") as pids:
    pids.write(f"{os.getpid()}\n{child.pid}\n{grandchild_pid}\n")
os.replace(partial, os.environ["PIDS_FILE"])
print("Started a child and a grandchild; sleeping.", flush=True)
while True:
    time.sleep(60)
