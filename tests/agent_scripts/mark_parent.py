"""Log who called, then become the program named by the arguments (same pid).

Appends "<label> <parent pid> <cwd>" to $CALLS_FILE (label: $CALLS_LABEL), so a test
knows which coordinator started each call of an evaluator or a verify command.
"""

from __future__ import annotations

import os
import sys

with open(os.environ["CALLS_FILE"], "a", encoding="utf-8") as calls:
    calls.write(f"{os.environ.get('CALLS_LABEL', 'call')} {os.getppid()} {os.getcwd()}\n")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
