"""Each node of a cluster with limits (`cloudtrain.spec.limits`) may delete itself, and only that.

A powered-off Azure VM stays allocated and billed, so a node that stops itself must ask ARM. It
does so as itself: the VM has a system-assigned managed identity (no secret anywhere: the node
gets a token from its metadata server). `grant` makes one custom role per cluster, *cloudtrain
self-stop*, whose actions are the ones self-stop needs and nothing else::

    Microsoft.Compute/virtualMachines/read               its own VM's state
    Microsoft.Compute/virtualMachines/delete             delete itself (disk, NIC, address go
                                                         with it: ``deleteOption: Delete``)
    Microsoft.Compute/virtualMachines/deallocate/action  stop billing without deleting

assignable in the cluster's resource group only, and assigns it to each VM's identity **at that
VM's own scope**: a node cannot create a VM, run a command on, read or delete a sibling, or touch
the network (Virtual Machine Contributor on the group, which this replaced, allowed all of
that). The next command here removes the group.

Role assignments and custom roles outlive the scope they are on (a deleted group leaves them
behind as "identity not found" and an unusable role), so `revoke` deletes the cluster's before
the group goes. Making them needs ``Microsoft.Authorization/roleAssignments/write`` and
``roleDefinitions/write`` on the group (Owner, or User Access Administrator, of the
subscription or group); without them `up` fails with ARM's 403 naming the action.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cloudtrain.errors import ProviderError

if TYPE_CHECKING:
    from cloudtrain.providers.azure._client import Clients

#: What a node may do to its own VM, and nothing else.
ACTIONS = (
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/delete",
    "Microsoft.Compute/virtualMachines/deallocate/action",
)
#: How cloudtrain's role assignments and roles say whose they are (their description begins
#: with it).
MARK = "cloudtrain:"
#: A new identity takes a while to reach the directory (PrincipalNotFound meanwhile).
PRINCIPAL_WAIT_S = 120.0


def assignment_name(vm_id: str) -> str:
    """The same GUID for the same VM: a second `up` finds the assignment it made."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, vm_id.lower()))


def role_name(scope: str) -> str:
    """The same GUID for the same resource group: its custom role's."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scope.lower()}/cloudtrain-self-stop"))


def grant(
    clients: Clients, group: str, vms: Sequence[str], cluster: str, cluster_id: str | None
) -> None:
    """Give each VM's identity the cluster's self-stop role on that VM alone (the role is
    made first; idempotent)."""
    from azure.core.exceptions import HttpResponseError, ResourceExistsError
    from azure.mgmt.authorization.v2022_04_01.models import (
        Permission,
        RoleAssignmentCreateParameters,
        RoleDefinition,
    )

    scope = f"/subscriptions/{clients.subscription}/resourceGroups/{group}"
    compute, auth = clients.compute(), clients.authorization()
    role = auth.role_definitions.create_or_update(
        scope,
        role_name(scope),
        RoleDefinition(
            role_name=f"cloudtrain self-stop {group}",
            description=f"{MARK} {cluster} ({cluster_id}): a node may read, deallocate or "
            "delete its own VM",
            role_type="CustomRole",
            permissions=[Permission(actions=list(ACTIONS), not_actions=[])],
            assignable_scopes=[scope],
        ),
    )
    for name in vms:
        vm = compute.virtual_machines.get(group, name)
        principal = vm.identity.principal_id if vm.identity else None
        if not principal or not vm.id:
            raise ProviderError(
                "azure",
                "NoIdentity",
                f"VM {name} came back without a system-assigned managed identity "
                "(identity.principalId), which a node needs to stop itself: the subscription "
                "(an Azure Policy, or the Microsoft.ManagedIdentity resource provider not "
                "registered) does not give VMs one; register Microsoft.ManagedIdentity and allow "
                "system-assigned identities, or leave out --idle-minutes, --max-hours and "
                "--max-cost; the VMs made were deleted",
            )
        params = RoleAssignmentCreateParameters(
            role_definition_id=role.id,
            principal_id=principal,
            principal_type="ServicePrincipal",
            description=f"{MARK} {cluster} ({cluster_id}): {name} may delete itself",
        )
        deadline = time.monotonic() + PRINCIPAL_WAIT_S
        while True:
            try:
                auth.role_assignments.create(vm.id, assignment_name(vm.id), params)
                break
            except ResourceExistsError:
                break  # made by an earlier `up`
            except HttpResponseError as exc:
                code = exc.error.code if exc.error else ""
                if code != "PrincipalNotFound" or time.monotonic() > deadline:
                    raise
                time.sleep(5)


def revoke(clients: Clients, group: str) -> None:
    """Delete cloudtrain's role assignments in `group` (on its VMs, gone or not) and then the
    group's self-stop role (made by `grant`). Idempotent."""
    from azure.core.exceptions import ResourceNotFoundError

    scope = f"/subscriptions/{clients.subscription}/resourceGroups/{group}"
    auth = clients.authorization()
    try:
        found = list(auth.role_assignments.list_for_scope(scope))
    except ResourceNotFoundError:
        found = []
    for item in found:
        mine = item.id and item.id.lower().startswith(scope.lower() + "/")
        if mine and (item.description or "").startswith(MARK):
            auth.role_assignments.delete_by_id(item.id)
    with contextlib.suppress(ResourceNotFoundError):
        auth.role_definitions.delete(scope, role_name(scope))


def unassign(clients: Clients, vm_ids: Sequence[str]) -> None:
    """Delete cloudtrain's role assignment on each VM of `vm_ids` (VMs removed while their
    cluster stays: the group's role stays for the others). Idempotent."""
    from azure.core.exceptions import ResourceNotFoundError

    auth = clients.authorization()
    for vm_id in vm_ids:
        with contextlib.suppress(ResourceNotFoundError):
            auth.role_assignments.delete(vm_id, assignment_name(vm_id))
