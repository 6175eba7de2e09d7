"""Jobs on a cluster: the coordinator, and torchrun's command line and failure reports."""
