"""The slurm provider: a cluster is an allocation of a Slurm cluster the team already runs.

`up` submits one batch job that holds the nodes (whole: every CPU, all memory, the GPUs asked
for) in ``--partition``, under ``--account`` and ``--qos``, for ``--time``; jobs run as steps
inside it; `down` cancels it. Slurm's commands run on the login node: this machine, or one
reached over SSH, with or without a home the nodes share. See
`cloudtrain.providers.slurm.provider`, and docs/guide/slurm.md for what is not served yet.
"""

from __future__ import annotations

from cloudtrain.provision.plugin import laid_out
from cloudtrain.provision.provider import NODE_PRICE, Option

#: What `up --provider slurm` takes beyond the spec.
OPTIONS = (
    Option(
        "login",
        "slurm: where Slurm's commands run: user@host[:port] (a login node, over SSH) or "
        "'local' (this machine is the login node; the default).",
        account=True,
    ),
    Option(
        "identity",
        "slurm: the private key for the login node (~/.ssh/id_ed25519).",
        kind="path",
        account=True,
    ),
    Option(
        "known_hosts",
        "slurm: where the login node's host key is pinned (~/.ssh/known_hosts).",
        kind="path",
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
        "slurm: the clusters' folder on the login node (default CLOUDTRAIN_HOME/slurm here, "
        "~/.cloudtrain/slurm on a login node over SSH); the nodes' folders are at the same "
        "path on each node, in it where they see it (a shared home).",
        account=True,
    ),
    Option(
        "python",
        "slurm: the nodes' Python, with torch and cloudtrain (default: this one; python3 "
        "over SSH).",
    ),
    NODE_PRICE,
)

PLUGIN = laid_out(__name__, "SlurmProvider", OPTIONS)
