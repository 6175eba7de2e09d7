"""cloudtrain: provision GPU clusters, run data-parallel PyTorch jobs on them, tear them down.

Importing this package is cheap: no SDK, no torch, no files opened.
"""

__version__ = "0.1.0"
