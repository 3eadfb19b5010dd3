"""A verify command for tests: logs where it ran, may sleep, then runs pytest with JUnit XML.

argv: JUNIT_PATH. VERIFY_CALLS (a file) gets the working folder of every call;
VERIFY_SLEEP seconds are slept first (with a child `sleep`, so a kill must reach the tree).
"""

from __future__ import annotations

import os
import subprocess
import sys


def main() -> int:
    calls = os.environ.get("VERIFY_CALLS")
    if calls:
        with open(calls, "a", encoding="utf-8") as log:
            log.write(f"{os.getcwd()} {os.getpid()}\n")
    pause = os.environ.get("VERIFY_SLEEP")
    if pause:
        subprocess.run(["sleep", pause], check=False)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={sys.argv[1]}",
    ]
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
