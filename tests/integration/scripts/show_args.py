"""Prints its argv and selected env values as JSON, to check they arrive verbatim."""

import json
import os
import sys

if os.environ.get("RANK") == "0":
    print("ARGS " + json.dumps({"argv": sys.argv[1:], "odd": os.environ.get("ODD")}), flush=True)
