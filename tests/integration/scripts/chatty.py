"""Prints LINES numbered lines of about 100 bytes (``line 000000 …``), the last with a terminal
title sequence in it: a node log far larger than what `cloudtrain logs` prints."""

import sys

count = int(sys.argv[1])
pad = "x" * 88
out = sys.stdout
for i in range(count - 1):
    out.write(f"line {i:06d} {pad}\n")
out.write(f"line {count - 1:06d} last \x1b]0;owned\x07\n")
out.flush()
