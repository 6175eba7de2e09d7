"""How a cloud node stops itself, with no credential of the user's on it. Stdlib only.

``poweroff``: the guest powers off (AWS then terminates the instance, by its
``InstanceInitiatedShutdownBehavior``; GCE keeps it ``TERMINATED``). ``arm``: a powered-off
Azure VM stays allocated and billed, so the node deletes its own VM through Azure Resource
Manager as its system-assigned managed identity: its resource id and a token come from the
metadata server, and the identity may delete VMs of its own resource group only
(`cloudtrain.providers.azure._identity`).

``CLOUDTRAIN_HALT_COMMAND`` (a test hook) replaces the power-off command: a stand-in's guest.

A node that removes its own folder (ssh, local) first moves its jobs' folders (logs, exit codes)
and checkpoints to `kept_dir`, beside it on the same disk (`keep`: renames, done at once): the
stop happens on the node, with nothing of the user's side there, so the node leaves them where
the next command at home takes them from (`cloudtrain.jobs.selfstopped`) before `down`
removes the cluster's folder with them.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePath

#: The ways: power the guest off; delete the VM through Azure Resource Manager as itself.
POWEROFF, ARM_DELETE = "poweroff", "arm"
KINDS = (POWEROFF, ARM_DELETE)
#: How a node powers itself off (its agent runs as the node's user, a sudoer).
HALT = ("sudo", "-n", "systemctl", "poweroff")
HALT_ENV = "CLOUDTRAIN_HALT_COMMAND"
IMDS = "http://169.254.169.254"
ARM = "https://management.azure.com"
VM_API = "2024-07-01"


#: What of a node's folder a self-stop keeps (`keep`): its jobs' folders and checkpoints.
KEPT = ("jobs", "checkpoints")


def kept_dir(root: PurePath) -> PurePath:
    """Where the node at `root` leaves what it keeps when it removes itself (`keep`)."""
    return root.with_name(f"{root.name}.kept")


def keep(root: Path) -> None:
    """Move `KEPT` of the node's folder to `kept_dir` (what an earlier life left there of the
    same job is replaced). A move that fails is reported, and the rest still moved."""
    for part in KEPT:
        source = root / part
        if not source.is_dir():
            continue
        target = Path(kept_dir(root)) / part
        for item in sorted(source.iterdir()):
            try:
                target.mkdir(mode=0o700, parents=True, exist_ok=True)
                if (target / item.name).exists():
                    shutil.rmtree(target / item.name, ignore_errors=True)
                os.replace(item, target / item.name)
            except OSError as exc:
                print(f"cloudtrain-agent: could not keep {item}: {exc}", file=sys.stderr)


def stop(kind: str, metadata: str | None = None, arm: str | None = None) -> str | None:
    """Stop this node the `kind` way; None when done, else what went wrong (one line)."""
    if kind == ARM_DELETE:
        return _azure_delete(metadata or IMDS, arm or ARM)
    hook = os.environ.get(HALT_ENV)
    command = shlex.split(hook) if hook else list(HALT)
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not power the node off: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-300:]
        return f"{shlex.join(command)} exited {done.returncode}: {said}"
    return None


def _get(url: str, headers: dict[str, str]) -> dict[str, object]:
    import urllib.request  # here: `up` imports this module for its names, and asks no URL

    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        found = json.loads(r.read())
    if not isinstance(found, dict):
        raise ValueError(f"{url}: not a JSON object")
    return found


def _azure_delete(metadata: str, arm: str) -> str | None:
    import urllib.error
    import urllib.parse
    import urllib.request

    base, flag = metadata.rstrip("/"), {"Metadata": "true"}
    try:
        me = _get(f"{base}/metadata/instance/compute?api-version=2021-02-01&format=json", flag)
        resource = urllib.parse.quote(f"{arm.rstrip('/')}/", safe="")
        token = _get(f"{base}/metadata/identity/oauth2/token?api-version=2018-02-01"
                     f"&resource={resource}", flag)["access_token"]  # fmt: skip
        url = f"{arm.rstrip('/')}{me['resourceId']}?api-version={VM_API}"
        request = urllib.request.Request(
            url, method="DELETE", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:300]
        return f"ARM answered {exc.code} to the node's delete of itself: {body}"
    except (OSError, ValueError, KeyError) as exc:
        return f"could not delete this VM through its managed identity: {exc}"
    return None if status in (200, 202, 204) else f"ARM answered {status}"
