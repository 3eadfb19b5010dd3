"""A command agent that prints some progress, then fails with an error (with markup) on stderr."""

import sys

print("Working on it...", flush=True)
print('Error: the model refused <script>alert("x")</script> & <b>stopped</b>', file=sys.stderr)
sys.exit(3)
