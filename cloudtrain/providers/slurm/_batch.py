"""What a cluster asks Slurm for: the batch job's options (`Batch.options`) and its script
(`Batch.script`), from the provider's options, each checked here (one clear line for a bad one)
before anything is asked of Slurm."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cloudtrain.errors import ConfigError
from cloudtrain.providers.slurm._executor import host_source
from cloudtrain.providers.slurm._host import OWNER
from cloudtrain.providers.slurm._slurm import comment
from cloudtrain.provision.provider import option_seconds
from cloudtrain.spec import ClusterSpec

#: How long `apply` lets the allocation pend before it cancels it (``--wait``), in seconds.
WAIT_S = 300.0
#: How long before the time limit the job is told to save (``--notice``), in seconds.
NOTICE_S = 120.0
#: What Slurm takes as a time limit: minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$", re.IGNORECASE)
#: A partition's, account's or QoS's name (and a cluster's, as Slurm's job name).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


@dataclass(frozen=True)
class Batch:
    """The batch job's settings the user chose (``--partition``, ``--account``, ``--qos``,
    ``--time``, ``--wait``, ``--notice``) and the nodes' Python."""

    python: str
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    wait_s: float = WAIT_S
    notice_s: int = int(NOTICE_S)

    @classmethod
    def from_options(cls, opts: Mapping[str, Any], python: str) -> Batch:
        time = str(opts.get("time") or "") or None
        if time is not None and not _TIME.fullmatch(time):
            raise ConfigError(
                f"--time {time!r}: give minutes, HH:MM:SS or D-HH:MM:SS (as sbatch takes)"
            )
        return cls(
            python=python,
            partition=_word(opts, "partition"),
            account=_word(opts, "account"),
            qos=_word(opts, "qos"),
            time=time,
            wait_s=option_seconds(opts, "wait", WAIT_S),
            notice_s=int(option_seconds(opts, "notice", NOTICE_S, most=65535)),
        )

    def options(self, spec: ClusterSpec, owner: str, index: int | None = None) -> list[str]:
        """sbatch's options for `spec` (for its node `index` alone, when given): whole nodes
        (every CPU and all memory), the GPUs."""
        options = [
            f"--job-name={spec.name}",
            f"--comment={comment(owner, spec.cluster_id, index)}",
            f"--nodes={spec.num_nodes if index is None else 1}",
            "--ntasks-per-node=1",
            "--exclusive",
            "--no-kill",  # a node lost leaves the others: the job goes on, it is made again
            "--no-requeue",  # a rerun of the script would bring back hosts without their agents
            "--mem=0",
            "--chdir=/",  # the cluster's folder may be none of the nodes': the script makes it
            "--output=/dev/null",  # the script writes its own log (`script`)
            f"--signal=B:USR1@{self.notice_s}",  # the notice before the time limit: `script`
        ]
        options += [f"--gres={gres}"] if (gres := _gres(spec)) else []
        for flag, value in (
            ("partition", self.partition),
            ("account", self.account),
            ("qos", self.qos),
            ("time", self.time),
        ):
            if value:
                options.append(f"--{flag}={value}")
        return options

    def script(self, spec: ClusterSpec, folder: str, first: int = 0) -> str:
        """The batch script, on the first node in `folder` (the cluster's): one host per node
        (`_host`: nodes `first`, `first` + 1 …), each in a step of its own that holds all of
        its node (a node lost ends only its own: ``--no-kill``); on Slurm's ``USR1`` before the
        time limit (``--signal=B:``, to this shell only: a step's signal reaches every process
        of the step, and would kill what does not catch it), the notice on every node, in a
        step of its own (``_host notice``). Its log is in `folder`; where that is the node's
        own (no ``owner.json``: the login node's folder is not shared), the script removes it,
        and `folder`, once the hosts have ended."""
        gres = f" --gres={gres}" if (gres := _gres(spec)) else ""
        base = shlex.quote(folder)
        python = shlex.quote(self.python)
        return (
            "#!/bin/bash\n"
            f"# cloudtrain cluster {spec.name}: `cloudtrain down {spec.name}` cancels it\n"
            f"base={base}\n"
            'umask 077; mkdir -p "$base" && cd "$base" || exit 1\n'
            'log="$base/slurm-$SLURM_JOB_ID.out"\n'
            f'shared=0; [ -f "$base/{OWNER}" ] && shared=1  # the login node\'s folder, or ours\n'
            'exec >>"$log" 2>&1\n'
            "HOST=$(cat <<'CLOUDTRAIN_HOST'\n"
            f"{host_source()}\n"
            "CLOUDTRAIN_HOST\n)\n"
            "notice() {\n"
            '  srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 '
            f'{python} -c "$HOST" notice {base}\n'
            "}\n"
            "trap notice USR1\n"
            "trap : TERM  # scancel's: the hosts end what they started, then this script\n"
            "for i in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do\n"
            '  srun --nodes=1 --ntasks=1 --relative="$i" --cpus-per-task="$SLURM_CPUS_ON_NODE" '
            f'--mem=0{gres} {python} -c "$HOST" serve {base} $((i + {first})) &\n'
            "done\n"
            'while [ -n "$(jobs -pr)" ]; do  # a trapped signal ends a wait: wait again\n'
            "  wait\n"
            "done\n"
            '[ "$shared" = 1 ] || { rm -f -- "$log"; cd /; rmdir -- "$base"; } 2>/dev/null\n'
        )


def _gres(spec: ClusterSpec) -> str:
    """sbatch's ``--gres`` for the spec's GPUs per node (``gpu:a100:8``); none without."""
    accelerator, count = spec.resources.accelerator, spec.resources.count
    return f"gpu:{accelerator.lower()}:{count}" if accelerator and count else ""


def _word(opts: Mapping[str, Any], key: str) -> str | None:
    value = str(opts.get(key) or "") or None
    if value is not None and not NAME.fullmatch(value):
        raise ConfigError(f"--{key} {value!r}: letters, digits and _.+- only, at most 64")
    return value
