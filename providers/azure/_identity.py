"""Each node of a cluster with limits (`cloudtrain.spec.limits`) may delete itself, and only that.

A powered-off Azure VM stays allocated and billed, so a node that stops itself must ask ARM. It
does so as itself: the VM has a system-assigned managed identity (no secret anywhere: the node
gets a token from its metadata server), and `grant` gives that identity the built-in role
*Virtual Machine Contributor* on the cluster's resource group only — VMs of that group, nothing
above it (no other group, no network or role change, not the group itself). The node's agent
then deletes its own VM, whose disk, NIC and address go with it (``deleteOption: Delete``); the
next command here removes the group.

Role assignments outlive the scope they are on (a deleted group leaves them behind as
"identity not found"), so `revoke` deletes the cluster's before the group goes. Making them
needs ``Microsoft.Authorization/roleAssignments/write`` on the group (Owner, or User Access
Administrator, of the subscription or group); without it `up` fails with ARM's 403 naming it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cloudtrain.errors import ProviderError

if TYPE_CHECKING:
    from cloudtrain.providers.azure._client import Clients

#: Built-in "Virtual Machine Contributor": manage VMs (delete one included), not access them.
ROLE = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
#: How a role assignment of cloudtrain says whose it is (its description begins with it).
MARK = "cloudtrain:"
#: A new identity takes a while to reach the directory (PrincipalNotFound meanwhile).
PRINCIPAL_WAIT_S = 120.0


def assignment_name(vm_id: str) -> str:
    """The same GUID for the same VM: a second `up` finds the assignment it made."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, vm_id.lower()))


def grant(
    clients: Clients, group: str, vms: Sequence[str], cluster: str, cluster_id: str | None
) -> None:
    """Give each VM's identity Virtual Machine Contributor on `group` (its resource group)."""
    from azure.core.exceptions import HttpResponseError, ResourceExistsError
    from azure.mgmt.authorization.v2022_04_01.models import RoleAssignmentCreateParameters

    sub = clients.subscription
    scope = f"/subscriptions/{sub}/resourceGroups/{group}"
    role = f"/subscriptions/{sub}/providers/Microsoft.Authorization/roleDefinitions/{ROLE}"
    compute, auth = clients.compute(), clients.authorization()
    for name in vms:
        vm = compute.virtual_machines.get(group, name)
        principal = vm.identity.principal_id if vm.identity else None
        if not principal or not vm.id:
            raise ProviderError("azure", "NoIdentity", f"VM {name} has no managed identity")
        params = RoleAssignmentCreateParameters(
            role_definition_id=role, principal_id=principal, principal_type="ServicePrincipal",
            description=f"{MARK} {cluster} ({cluster_id}): {name} may delete itself",
        )  # fmt: skip
        deadline = time.monotonic() + PRINCIPAL_WAIT_S
        while True:
            try:
                auth.role_assignments.create(scope, assignment_name(vm.id), params)
                break
            except ResourceExistsError:
                break  # made by an earlier `up`
            except HttpResponseError as exc:
                code = exc.error.code if exc.error else ""
                if code != "PrincipalNotFound" or time.monotonic() > deadline:
                    raise
                time.sleep(5)


def revoke(clients: Clients, group: str) -> None:
    """Delete cloudtrain's role assignments on `group` (made by `grant`)."""
    from azure.core.exceptions import ResourceNotFoundError

    scope = f"/subscriptions/{clients.subscription}/resourceGroups/{group}"
    auth = clients.authorization()
    try:
        found = list(auth.role_assignments.list_for_scope(scope, filter="atScope()"))
    except ResourceNotFoundError:
        return
    for item in found:
        if item.name and (item.description or "").startswith(MARK):
            auth.role_assignments.delete(scope, item.name)
