"""Fails with an exception whose message would write the terminal's clipboard (OSC 52), set its
title and clear it (a C1 CSI), as a hostile or careless script may print: `train` shows the
failure's tail, which must reach the user's terminal as text."""

print("about to fail", flush=True)
raise RuntimeError("boom \x1b]52;c;b3duZWQ=\x07 \x1b]0;owned\x07 \x9b2J")
