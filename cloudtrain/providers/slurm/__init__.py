"""The slurm provider: a cluster is an allocation of a Slurm cluster the team already runs.

`up` submits one batch job that holds the nodes (whole: every CPU, all memory, the GPUs asked
for) in ``--partition``, under ``--account`` and ``--qos``, for ``--time``; jobs run as steps
inside it; `down` cancels it. See `cloudtrain.providers.slurm.provider`. Not offered in the CLI's
help yet (``for_tests``): the login node is this machine only, and the cluster's folder must be
one every node sees at the same path.
"""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import NODE_PRICE, Option

#: What `up --provider slurm` takes beyond the spec.
OPTIONS = (
    Option(
        "login",
        "slurm: where Slurm's commands run: 'local' (this machine is the login node).",
        account=True,
    ),
    Option("partition", "slurm: the partition (default: Slurm's default one)."),
    Option("account", "slurm: the account the allocation is charged to."),
    Option("qos", "slurm: the quality of service."),
    Option("time", "slurm: the allocation's time limit (minutes, HH:MM:SS or D-HH:MM:SS)."),
    Option("wait", "slurm: seconds the allocation may pend before `up` cancels it (300)."),
    Option(
        "notice",
        "slurm: seconds before the time limit that the job is told to save, as on a "
        "preemption notice (120).",
    ),
    Option(
        "shared_dir",
        "slurm: a folder the login node and every node see at one path "
        "(default CLOUDTRAIN_HOME/slurm).",
        account=True,
    ),
    Option(
        "python",
        "slurm: the nodes' Python, with torch and cloudtrain (default: this one).",
    ),
    NODE_PRICE,
)

PLUGIN = laid_out(__name__, "SlurmProvider", OPTIONS, for_tests=True)
