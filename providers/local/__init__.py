"""The embedded local provider: nodes are folders on this machine, jobs are processes."""
