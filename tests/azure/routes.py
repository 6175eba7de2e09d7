"""The routes of the ARM stand-in: which request touches which part of `arm.Store`.

A mixin of `StandIn` (``standin.py``), kept apart so each file stays readable; it reads the
stand-in's ``store``, ``tokens``, ``base``, ``token_error``, ``page_size`` and ``retry_after``.
Besides the routes ``standin.py`` lists, it serves each location's compute usages (``GET
/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/usages``, `arm.USAGES`).
"""

from __future__ import annotations

import re
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlencode

from tests.azure import identity
from tests.azure.arm import LRO_TYPES, ArmError, Operation, Store

SUBSCRIPTION = "00000000-0000-0000-0000-0000000c10d0"
#: An OData string literal: quoted, a quote inside it doubled (an unescaped one ends it).
LITERAL = r"'((?:[^']|'')*)'"
CLIENT_SECRET = "standin-secret-not-for-logs"
Answer = tuple[int, dict[str, str], Any]


class Routes:
    """Answers one ARM or token request: ``(status, headers, JSON body or None)``."""

    store: Store
    tokens: set[str]
    #: tokens of VMs' managed identities → their principal (`identity`)
    identities: dict[str, str]
    base: str
    token_error: str | None
    page_size: int
    retry_after: str

    def _route(
        self, method: str, path: str, query: dict[str, str], body: Any, headers: dict[str, str]
    ) -> Answer:
        segs = [s for s in path.split("/") if s]
        low = [s.lower() for s in segs]
        if low[0] == "_imds":  # a node's metadata server, not ARM
            return 200, {}, identity.imds(self.store, self.identities, path, headers)
        if low[-1:] == ["openid-configuration"] or "oauth2" in low:
            return self._token(segs[0], low, body)
        token = headers.get("authorization", "").removeprefix("Bearer ")
        if token in self.identities:
            identity.allowed(self.store, self.identities[token], method, path)
        elif token not in self.tokens:
            raise ArmError(401, "AuthenticationFailed", "no valid bearer token")
        if len(low) < 3 or low[0] != "subscriptions" or low[1] != SUBSCRIPTION:
            raise ArmError(404, "SubscriptionNotFound", f"subscription of {path} not found")
        if "operations" in low or "operationresults" in low:
            return self._operation(low)
        rule = self.store.fault(method, "*", None, None)  # rules for every kind of request
        if rule is not None:
            raise ArmError(rule.status, rule.code, rule.message)
        if low[2] == "resourcegroups":
            if len(low) == 3:
                return self._page(self._groups(query), query, path)
            if len(low) == 4:
                return self._group(method, "/".join(["", *segs]), body)
            if len(low) == 7:
                prefix = "/".join(["", *segs[:4]])
                return self._page(self.store.of_type(f"{segs[5]}/{segs[6]}", prefix), query, path)
            if len(low) == 8:
                return self._resource(method, "/".join(["", *segs]), segs, body)
            if len(low) == 12 and low[8:11] == ["providers", "microsoft.authorization",
                                                 "roleassignments"]:  # fmt: skip
                return self._assignment_on(method, "/".join(["", *segs]), body)
        if low[2:5] == ["providers", "microsoft.compute", "virtualmachines"]:
            return self._page(self._vms(), query, path)
        if low[2:5] == ["providers", "microsoft.compute", "locations"] and low[6:] == ["usages"]:
            return self._page(self.store.usage_list(low[5]), query, path)
        if low[2:5] == ["providers", "microsoft.compute", "skus"]:
            return 200, {}, {"value": self._skus(query.get("$filter", ""))}
        raise ArmError(404, "NotFound", f"no route for {method} {path}")

    def _token(self, tenant: str, low: list[str], body: Any) -> Answer:
        base = f"{self.base}/{tenant}"
        if low[-1] == "openid-configuration":
            return (
                200,
                {},
                {
                    "token_endpoint": f"{base}/oauth2/v2.0/token",
                    "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                    "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
                    "issuer": f"{base}/v2.0",
                },
            )
        form = dict(parse_qsl(body)) if isinstance(body, str) else {}
        if self.token_error or form.get("client_secret") != CLIENT_SECRET:
            code = self.token_error or "invalid_client"
            return (
                401,
                {},
                {
                    "error": code,
                    "error_description": "AADSTS7000215: Invalid client secret provided.",
                },
            )
        token = f"standin-{uuid.uuid4().hex}"
        self.tokens.add(token)
        return 200, {}, {"access_token": token, "token_type": "Bearer", "expires_in": 3600}

    def _async(self, op: Operation, location: str) -> dict[str, str]:
        """The headers of an accepted long-running PUT/DELETE: where to poll, and when."""
        url = (
            f"{self.base}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/"
            f"{location or 'global'}/operations/{op.id}?api-version=2024-11-01"
        )
        return {"Azure-AsyncOperation": url, "Retry-After": self.retry_after}

    def _operation(self, low: list[str]) -> Answer:
        status = self.store.poll(low[-1])
        if low[-2] == "operationresults":  # a Location-header poll: 202 until done, then 200
            if status["status"] == "InProgress":
                return (
                    202,
                    {"Location": f"{self.base}/{'/'.join(low)}", "Retry-After": self.retry_after},
                    None,
                )
            return 200, {}, None
        return (
            200,
            ({"Retry-After": self.retry_after} if status["status"] == "InProgress" else {}),
            status,
        )

    def _groups(self, query: dict[str, str]) -> list[dict[str, Any]]:
        groups = self.store.of_type("Microsoft.Resources/resourceGroups")
        wanted = re.fullmatch(
            rf"tagName eq {LITERAL} and tagValue eq {LITERAL}", query.get("$filter", "").strip()
        )
        if query.get("$filter") and not wanted:
            raise ArmError(400, "InvalidFilter", f"unsupported $filter {query['$filter']!r}")
        if wanted:
            key, value = (_unquote(g) for g in wanted.groups())
            groups = [g for g in groups if (g.get("tags") or {}).get(key) == value]
        return groups

    def _group(self, method: str, rid: str, body: Any) -> Answer:
        found = self.store.get(rid)
        if method in ("GET", "HEAD"):
            if found is None:
                raise ArmError(404, "ResourceGroupNotFound", f"{rid} could not be found.")
            return (200 if method == "GET" else 204), {}, found if method == "GET" else None
        if method == "PUT":
            if found is not None and found["location"] != body["location"]:
                raise ArmError(
                    409, "InvalidResourceGroupLocation", f"resource group is in {found['location']}"
                )
            name = rid.rsplit("/", 1)[1]
            group = self.store.put(
                rid,
                {
                    "name": name,
                    "location": body["location"],
                    "type": "Microsoft.Resources/resourceGroups",
                    "tags": body.get("tags") or {},
                    "properties": {"provisioningState": "Succeeded"},
                },
            )
            return (200 if found else 201), {}, group
        if method == "DELETE":
            if found is None:
                raise ArmError(404, "ResourceGroupNotFound", f"{rid} could not be found.")
            outlive = (identity.ASSIGNMENTS, identity.DEFINITIONS)  # as in ARM
            for resource in self.store.under(rid):
                if str(resource.get("type", "")).lower() not in outlive:
                    self.store.delete(resource["id"])
            self.store.delete(rid)
            op = self.store.start(rid)
            url = f"{self.base}/subscriptions/{SUBSCRIPTION}/operationresults/{op.id}"
            return 202, {"Location": url, "Retry-After": self.retry_after}, None
        raise ArmError(405, "MethodNotAllowed", method)

    def _resource(self, method: str, rid: str, segs: list[str], body: Any) -> Answer:
        group = "/".join(["", *segs[:4]])
        rtype, name = f"{segs[5]}/{segs[6]}", segs[7]
        lro = segs[6].lower() in LRO_TYPES
        if method == "GET":
            self.store.settle(rid)
            found = self.store.get(rid)
            if found is None:
                raise ArmError(404, "ResourceNotFound", f"{rtype} '{name}' was not found.")
            return 200, {}, found
        if method == "DELETE":
            found = self.store.get(rid)
            if found is None:
                return 204, {}, None
            if rtype.lower() == "microsoft.compute/virtualmachines":
                self.store.delete_vm(rid)
            else:
                self.store.delete(rid)
            return (
                (202, self._async(self.store.start(rid), found.get("location", "")), None)
                if lro
                else (200, {}, None)
            )
        if method != "PUT":
            raise ArmError(405, "MethodNotAllowed", method)
        if self.store.get(group) is None:
            raise ArmError(404, "ResourceGroupNotFound", f"{group} could not be found.")
        location = str(body.get("location", "")).lower()
        if rtype.lower() == "microsoft.compute/virtualmachines":
            op = self.store.create_vm(rid, body, group)
            if self.store.omit_identity:
                (self.store.get(rid) or {}).pop("identity", None)
            else:
                identity.assign(self.store.get(rid) or {})
            return 201, self._async(op, location), self.store.get(rid)
        if rtype.lower() == identity.ASSIGNMENTS:
            identity.check_assignment(self.store, rid, body)
        if rtype.lower() == identity.DEFINITIONS:
            identity.check_definition(rid, body)
        existed = self.store.get(rid) is not None
        props = body.setdefault("properties", {})
        for child in ("subnets", "securityRules"):
            for item in props.get(child, []):
                item["id"] = f"{rid}/{child}/{item['name']}"
                item.setdefault("properties", {})["provisioningState"] = "Succeeded"
        props["provisioningState"] = "Succeeded"
        made = self.store.put(rid, {**body, "name": name, "type": rtype})
        extra = self._async(self.store.start(rid), location) if lro else {}
        return (200 if existed else 201), extra, made

    def _assignment_on(self, method: str, rid: str, body: Any) -> Answer:
        """A role assignment at one resource's scope (``{resource}/providers/Microsoft.
        Authorization/roleAssignments/{guid}``), which outlives that resource."""
        found = self.store.get(rid)
        if method == "GET":
            if found is None:
                raise ArmError(404, "RoleAssignmentNotFound", f"{rid} was not found.")
            return 200, {}, found
        if method == "DELETE":
            return (200, {}, self.store.delete(rid)) if found else (204, {}, None)
        if method != "PUT":
            raise ArmError(405, "MethodNotAllowed", method)
        scope = rid[: rid.lower().index("/providers/microsoft.authorization")]
        if self.store.get(scope) is None:
            raise ArmError(404, "ResourceNotFound", f"{scope} was not found.")
        if found is not None:
            raise ArmError(409, "RoleAssignmentExists", "The role assignment already exists.")
        identity.check_assignment(self.store, rid, body)
        name = rid.rsplit("/", 1)[1]
        made = self.store.put(
            rid, {**body, "name": name, "type": "Microsoft.Authorization/roleAssignments"}
        )
        return 201, {}, made

    def _vms(self) -> list[dict[str, Any]]:
        vms = self.store.of_type("Microsoft.Compute/virtualMachines")
        for vm in vms:
            self.store.settle(vm["id"])
        return vms

    def _page(self, items: list[dict[str, Any]], query: dict[str, str], path: str) -> Answer:
        """One page of `items`; a ``nextLink`` with a ``$skiptoken`` when more follow."""
        start = int(query.get("$skiptoken", "0"))
        page: dict[str, Any] = {"value": items[start : start + self.page_size]}
        if start + self.page_size < len(items):
            rest = {k: v for k, v in query.items() if k != "$skiptoken"}
            link = urlencode({**rest, "$skiptoken": str(start + self.page_size)})
            page["nextLink"] = f"{self.base}{path}?{link}"
        return 200, {}, page

    def _skus(self, flt: str) -> list[dict[str, Any]]:
        wanted = re.fullmatch(rf"location eq {LITERAL}", flt.strip())
        if flt.strip() and not wanted:
            raise ArmError(400, "InvalidFilter", f"unsupported $filter {flt!r}")
        locations = [_unquote(wanted.group(1))] if wanted else list(self.store.skus)
        return [
            _sku(size, loc, zones, size not in self.store.no_accelerated_networking)
            for loc in locations
            for size, zones in self.store.skus.get(loc, {}).items()
        ]


def _unquote(literal: str) -> str:
    """The value of an OData string literal's inside (`LITERAL`'s group)."""
    return literal.replace("''", "'")


def _sku(size: str, location: str, zones: list[str] | None, accelerated: bool) -> dict[str, Any]:
    """A ``resource_skus`` entry as ARM writes it, with its restrictions."""
    rule = {"values": [location], "reasonCode": "NotAvailableForSubscription"}
    restricted = sorted({"1", "2", "3"} - set(zones or []))
    restrictions: list[dict[str, Any]] = []
    if zones is None:
        restrictions = [{**rule, "type": "Location", "restrictionInfo": {"locations": [location]}}]
    elif restricted:
        restrictions = [
            {
                **rule,
                "type": "Zone",
                "restrictionInfo": {"locations": [location], "zones": restricted},
            }
        ]
    return {
        "resourceType": "virtualMachines",
        "name": size,
        "tier": "Standard",
        "size": size.removeprefix("Standard_"),
        "locations": [location],
        "locationInfo": [{"location": location, "zones": ["1", "2", "3"]}],
        "capabilities": [
            {"name": "AcceleratedNetworkingEnabled", "value": str(accelerated)},
            {"name": "HyperVGenerations", "value": "V2"},
        ],
        "restrictions": restrictions,
    }
