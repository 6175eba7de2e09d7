"""Managed identities in the ARM stand-in: what a VM's system-assigned identity may do.

- A VM PUT with ``identity: {type: SystemAssigned}`` gets a ``principalId`` (`assign`).
- Role assignments are resources at a scope (``{scope}/providers/Microsoft.Authorization/
  roleAssignments/{guid}``; a scope may be a group or one resource in it): of the built-in
  roles below, or of a custom role made in a group (``roleDefinitions/{guid}``, its actions
  with ``*`` wildcards, assignable only under its ``assignableScopes``); the principal must
  exist. Both outlive the scope they are on, as in ARM.
- The node's metadata server, per VM: ``/_imds/{vm}/metadata/instance/compute`` (its resource
  id) and ``/_imds/{vm}/metadata/identity/oauth2/token`` (a token of its identity), both only
  with ``Metadata: true``, as IMDS checks.
- A request with an identity's token is allowed only when a role assignment of that principal
  has a scope the request's resource is under and a role whose actions cover it (`allowed`);
  otherwise 403 ``AuthorizationFailed``, naming the action and scope, as ARM does.
"""

from __future__ import annotations

import fnmatch
import uuid
from typing import Any

from tests.azure.arm import ArmError, Store

#: Built-in roles the stand-in knows: GUID → (name, the actions it allows, as prefixes).
ROLES = {
    "9980e02c-c2be-4d73-94e8-173b1dc7cf3c": (
        "Virtual Machine Contributor", ("microsoft.compute/virtualmachines/",),
    ),
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": ("Reader", ()),
}  # fmt: skip
ASSIGNMENTS = "microsoft.authorization/roleassignments"
DEFINITIONS = "microsoft.authorization/roledefinitions"
METHOD_VERBS = {"GET": "read", "PUT": "write", "DELETE": "delete", "POST": "action"}


def assign(vm: dict[str, Any]) -> None:
    """A system-assigned identity for a VM that asks for one."""
    identity = vm.get("identity") or {}
    if "systemassigned" in str(identity.get("type", "")).lower():
        identity.update(principalId=str(uuid.uuid4()), tenantId="standin-tenant")
        vm["identity"] = identity


def principals(store: Store) -> set[str]:
    return {
        str(vm["identity"]["principalId"])
        for vm in store.of_type("Microsoft.Compute/virtualMachines")
        if (vm.get("identity") or {}).get("principalId")
    }


def role_actions(store: Store, role: str) -> tuple[str, ...] | None:
    """The actions (``fnmatch`` patterns, lowercase) of the role whose GUID is `role`; None
    when no such role exists."""
    if role in ROLES:
        return tuple(f"{prefix}*" for prefix in ROLES[role][1])
    made = next((d for d in store.of_type(DEFINITIONS) if d["name"] == role), None)
    if made is None:
        return None
    perms = (made.get("properties") or {}).get("permissions") or []
    return tuple(str(a).lower() for p in perms for a in (p.get("actions") or []))


def check_definition(rid: str, body: dict[str, Any]) -> None:
    """ARM's checks of a custom role PUT: a name, actions, scopes it may be assigned in."""
    props = body.get("properties") or {}
    scopes = props.get("assignableScopes") or []
    if not props.get("roleName") or not props.get("permissions") or not scopes:
        raise ArmError(400, "InvalidRoleDefinition", "roleName, permissions and "
                       "assignableScopes are required")  # fmt: skip
    home = rid[: rid.lower().index("/providers/microsoft.authorization")].lower()
    if any(not str(sc).lower().startswith(home) for sc in scopes):
        raise ArmError(400, "InvalidRoleDefinition", f"assignableScopes {scopes} exceed {home}")


def check_assignment(store: Store, rid: str, body: dict[str, Any]) -> None:
    """ARM's checks of a role assignment PUT: a known role assignable at its scope, an
    existing principal."""
    props = body.get("properties") or {}
    role = str(props.get("roleDefinitionId", "")).rsplit("/", 1)[-1]
    if role_actions(store, role) is None:
        raise ArmError(400, "RoleDefinitionDoesNotExist", f"role {role!r} does not exist")
    made = next((d for d in store.of_type(DEFINITIONS) if d["name"] == role), None)
    if made is not None:
        scope = rid[: rid.lower().index("/providers/microsoft.authorization")].lower()
        allowed_in = [str(sc).lower() for sc in made["properties"]["assignableScopes"]]
        if not any(scope == a or scope.startswith(a + "/") for a in allowed_in):
            raise ArmError(400, "InvalidRoleAssignmentScope", f"role {role} is not "
                           f"assignable at {scope}")  # fmt: skip
    if props.get("principalId") not in principals(store):
        raise ArmError(400, "PrincipalNotFound", f"principal {props.get('principalId')!r} "
                       "does not exist in the directory")  # fmt: skip


def action(method: str, path: str) -> str:
    """``microsoft.compute/virtualmachines/delete`` for ``DELETE .../virtualMachines/vm``."""
    low = [s.lower() for s in path.split("/") if s]
    if "providers" not in low:
        return f"microsoft.resources/subscriptions/resourcegroups/{METHOD_VERBS[method]}"
    at = len(low) - 1 - low[::-1].index("providers")
    kind = "/".join([low[at + 1], *low[at + 2 :: 2]])
    verb = METHOD_VERBS.get(method, "action")
    if method == "POST" and len(low) > at + 4:  # .../virtualMachines/vm/deallocate
        verb = f"{low[-1]}/action"
    return f"{kind}/{verb}"


def allowed(store: Store, principal: str, method: str, path: str) -> None:
    """Raise 403 unless one of `principal`'s role assignments covers the request."""
    wanted = action(method, path)
    for grant in store.of_type("Microsoft.Authorization/roleAssignments"):
        props = grant.get("properties") or {}
        if props.get("principalId") != principal:
            continue
        rid = str(grant["id"])
        scope = rid[: rid.lower().index("/providers/microsoft.authorization")]
        role = str(props.get("roleDefinitionId", "")).rsplit("/", 1)[-1]
        at = path.lower().rstrip("/")
        under = at == scope.lower() or at.startswith(scope.lower().rstrip("/") + "/")
        if under and any(fnmatch.fnmatchcase(wanted, p) for p in role_actions(store, role) or ()):
            return
    raise ArmError(403, "AuthorizationFailed", f"The client '{principal}' does not have "
                   f"authorization to perform action '{wanted}' over scope '{path}'")  # fmt: skip


def imds(store: Store, tokens: dict[str, str], path: str, headers: dict[str, str]) -> Any:
    """The node metadata server of the VM named in ``/_imds/{vm}/...``."""
    if headers.get("metadata", "").lower() != "true":
        raise ArmError(400, "BadRequest", "Required metadata header not specified")
    segs = [s for s in path.split("/") if s]
    name, rest = segs[1], "/".join(segs[2:])
    vm = next((v for v in store.of_type("Microsoft.Compute/virtualMachines")
               if v["name"] == name), None)  # fmt: skip
    if vm is None:
        raise ArmError(404, "NotFound", f"no VM {name}")
    if rest == "metadata/instance/compute":
        return {"name": name, "resourceId": vm["id"], "location": vm.get("location")}
    if rest == "metadata/identity/oauth2/token":
        principal = (vm.get("identity") or {}).get("principalId")
        if not principal:
            raise ArmError(400, "invalid_request", "Identity not found")
        token = f"identity-{uuid.uuid4().hex}"
        tokens[token] = str(principal)
        return {"access_token": token, "token_type": "Bearer", "expires_in": "3600",
                "resource": "https://management.azure.com/"}  # fmt: skip
    raise ArmError(404, "NotFound", f"no metadata at {rest}")
