"""URL → API method → handler, for the GCE REST subset of the stand-in (``/compute/v1/...``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.gcp.gce import ApiError, Gce, matches

if TYPE_CHECKING:
    from tests.gcp.standin import Call, Fault

Args = dict[str, str]
Handler = Callable[[Gce, "Call", Args, int], dict[str, Any]]
_PATH = re.compile(r"^/compute/v1/projects/([^/]+)(?:/(.*))?$")


def page(items: list[Any], call: Call, size: int) -> tuple[list[Any], dict[str, Any]]:
    """One page of `items` (``maxResults`` capped at the stand-in's page size) and its token."""
    start = int(call.query.get("pageToken") or 0)
    count = min(int(call.query.get("maxResults") or 500), size)
    more = {"nextPageToken": str(start + count)} if start + count < len(items) else {}
    return items[start : start + count], more


def _op(g: Gce, c: Call, a: Args, s: int) -> dict[str, Any]:
    return g.get_operation(a["op"])


Z, R, N, OP = (
    "zones/(?P<zone>[^/]+)",
    "regions/(?P<region>[^/]+)",
    "(?P<name>[^/]+)",
    "(?P<op>[^/]+)",
)
ROUTES: list[tuple[str, str, str, Handler]] = [
    ("GET", "", "projects.get", lambda g, c, a, s: g.project_body()),
    ("GET", R, "regions.get", lambda g, c, a, s: g.region_body(a["region"])),
    ("GET", f"{Z}/instances", "instances.list", lambda g, c, a, s: _list(g, c, s, a["zone"])),
    (
        "POST",
        f"{Z}/instances/bulkInsert",
        "instances.bulkInsert",
        lambda g, c, a, s: _bulk_insert(g, c, a["zone"]),
    ),
    ("POST", f"{Z}/instances", "instances.insert", lambda g, c, a, s: _insert(g, c, a["zone"])),
    (
        "GET",
        f"{Z}/instances/{N}",
        "instances.get",
        lambda g, c, a, s: g.read(_instance(g, a["zone"], a["name"])),
    ),
    (
        "DELETE",
        f"{Z}/instances/{N}",
        "instances.delete",
        lambda g, c, a, s: g.delete_instance(a["zone"], a["name"]),
    ),
    (
        "GET",
        "aggregated/instances",
        "instances.aggregatedList",
        lambda g, c, a, s: _list(g, c, s, None),
    ),
    ("GET", f"{Z}/operations/{OP}", "zoneOperations.get", _op),
    ("POST", f"{Z}/operations/{OP}/wait", "zoneOperations.wait", _op),
    ("GET", f"{R}/operations/{OP}", "regionOperations.get", _op),
    ("POST", f"{R}/operations/{OP}/wait", "regionOperations.wait", _op),
    ("GET", f"global/operations/{OP}", "globalOperations.get", _op),
    ("POST", f"global/operations/{OP}/wait", "globalOperations.wait", _op),
    ("GET", "global/firewalls", "firewalls.list", lambda g, c, a, s: _firewalls(g, c, s)),
    ("POST", "global/firewalls", "firewalls.insert", lambda g, c, a, s: _firewall_insert(g, c)),
    ("GET", f"global/firewalls/{N}", "firewalls.get", lambda g, c, a, s: _firewall(g, a["name"])),
    (
        "PATCH",
        f"global/firewalls/{N}",
        "firewalls.patch",
        lambda g, c, a, s: g.patch_firewall(a["name"], c.body or {}),
    ),
    (
        "DELETE",
        f"global/firewalls/{N}",
        "firewalls.delete",
        lambda g, c, a, s: _firewall_delete(g, a["name"]),
    ),
    (
        "POST",
        f"{R}/resourcePolicies",
        "resourcePolicies.insert",
        lambda g, c, a, s: _policy_insert(g, c, a["region"]),
    ),
    (
        "DELETE",
        f"{R}/resourcePolicies/{N}",
        "resourcePolicies.delete",
        lambda g, c, a, s: g.delete_policy(a["region"], a["name"]),
    ),
    (
        "GET",
        "aggregated/resourcePolicies",
        "resourcePolicies.aggregatedList",
        lambda g, c, a, s: _policies(g, c, s),
    ),
    (
        "GET",
        "aggregated/acceleratorTypes",
        "acceleratorTypes.aggregatedList",
        lambda g, c, a, s: _accelerators(g, c, s, None),
    ),
    (
        "GET",
        f"{Z}/acceleratorTypes",
        "acceleratorTypes.list",
        lambda g, c, a, s: _accelerators(g, c, s, a["zone"]),
    ),
]


def route(method: str, path: str, gce: Gce) -> tuple[str, str | None, Args, Handler]:
    """(API method name, zone or None, path arguments, handler); 404 for anything else."""
    found = _PATH.match(path)
    if found and found.group(1) == gce.project:
        for verb, pattern, name, handler in ROUTES:
            args = re.fullmatch(pattern, found.group(2) or "") if verb == method else None
            if args:
                return name, args.groupdict().get("zone"), args.groupdict(), handler
    return "unknown", None, {}, _missing(path)


def _missing(path: str) -> Handler:
    def handler(gce: Gce, call: Call, args: Args, size: int) -> dict[str, Any]:
        raise ApiError(404, "notFound", f"the stand-in does not serve {call.method} {path}")

    return handler


def _instance(gce: Gce, zone: str, name: str) -> dict[str, Any]:
    if (zone, name) not in gce.instances:
        raise ApiError(
            404, "notFound", f"The resource 'zones/{zone}/instances/{name}' was not found"
        )
    return gce.instances[(zone, name)]


def _list(gce: Gce, call: Call, size: int, zone: str | None) -> dict[str, Any]:
    found = [
        gce.read(i)
        for (z, _), i in sorted(gce.instances.items())
        if (zone is None or z == zone) and matches(i, call.query.get("filter"))
    ]
    items, more = page(found, call, size)
    if zone is not None:
        return {"kind": "compute#instanceList", "items": items, **more}
    grouped: dict[str, dict[str, list[Any]]] = {}
    for inst in items:
        grouped.setdefault(f"zones/{inst['zone'].rsplit('/', 1)[-1]}", {"instances": []})[
            "instances"
        ].append(inst)
    return {"kind": "compute#instanceAggregatedList", "items": grouped, **more}


def _names(gce: Gce, zone: str, body: dict[str, Any]) -> list[str]:
    names = list(body.get("perInstanceProperties") or {})
    count = int(body.get("count", 0))
    if not names or len(names) != count or int(body.get("minCount", count)) != count:
        raise ApiError(
            400,
            "invalid",
            "the stand-in takes perInstanceProperties names with count = minCount = len(names)",
        )
    taken = [n for n in names if (zone, n) in gce.instances]
    if taken:
        raise ApiError(409, "alreadyExists", f"The resource '{taken[0]}' already exists")
    return names


def _bulk_insert(gce: Gce, call: Call, zone: str) -> dict[str, Any]:
    body = call.body
    names = _names(gce, zone, body)
    gce.check_shape(zone, body["instanceProperties"])
    for name in names:
        gce.create_instance(zone, name, body["instanceProperties"])
    return gce.operation("bulkInsert", gce.link("zones", zone), ("zones", zone))


def _insert(gce: Gce, call: Call, zone: str) -> dict[str, Any]:
    body = call.body
    if (zone, body["name"]) in gce.instances:
        raise ApiError(409, "alreadyExists", f"The resource '{body['name']}' already exists")
    gce.check_shape(zone, body)
    gce.create_instance(zone, body["name"], body)
    return gce.operation("insert", gce.instances[(zone, body["name"])]["selfLink"], ("zones", zone))


def failed(gce: Gce, call: Call, fault: Fault, status: int, message: str) -> dict[str, Any]:
    """The operation of a call that was accepted and then failed with `fault`."""
    if call.name == "instances.bulkInsert" and call.zone:
        for name in list(call.body.get("perInstanceProperties") or {})[: fault.partial]:
            gce.create_instance(call.zone, name, call.body["instanceProperties"])
    detail = (
        {
            "quotaInfo": {
                "metricName": fault.quota,
                "limitName": f"{fault.quota}-per-project",
                "limit": 0,
            }
        }
        if fault.code == "QUOTA_EXCEEDED"
        else None
    )
    error = {
        "error": {
            "errors": [
                {
                    "code": fault.code,
                    "message": message,
                    **({"errorDetails": [detail]} if detail else {}),
                }
            ]
        },
        "httpErrorStatusCode": status,
        "httpErrorMessage": "SERVICE UNAVAILABLE" if status == 503 else "FORBIDDEN",
    }
    scope = ("zones", call.zone) if call.zone else None
    return gce.operation(call.name.split(".")[-1], call.path, scope, error=error)


def _firewalls(gce: Gce, call: Call, size: int) -> dict[str, Any]:
    found = [f for _, f in sorted(gce.firewalls.items()) if matches(f, call.query.get("filter"))]
    items, more = page(found, call, size)
    return {"kind": "compute#firewallList", "items": items, **more}


def _firewall(gce: Gce, name: str) -> dict[str, Any]:
    if name not in gce.firewalls:
        raise ApiError(404, "notFound", f"The resource 'global/firewalls/{name}' was not found")
    return gce.firewalls[name]


def _firewall_insert(gce: Gce, call: Call) -> dict[str, Any]:
    return gce.operation("insert", gce.add_firewall(call.body)["selfLink"], None)


def _firewall_delete(gce: Gce, name: str) -> dict[str, Any]:
    _firewall(gce, name)
    return gce.operation(
        "delete",
        gce.link("global", "firewalls", name),
        None,
        lambda: gce.firewalls.pop(name, None) and None,
    )


def _policy_insert(gce: Gce, call: Call, region: str) -> dict[str, Any]:
    name = call.body["name"]
    if (region, name) in gce.policies:
        raise ApiError(409, "alreadyExists", f"The resource '{name}' already exists")
    link = gce.link("regions", region, "resourcePolicies", name)
    gce.policies[(region, name)] = {
        **call.body,
        "region": gce.link("regions", region),
        "selfLink": link,
        "status": "READY",
    }
    return gce.operation("insert", link, ("regions", region))


def _policies(gce: Gce, call: Call, size: int) -> dict[str, Any]:
    found = [
        (r, p) for (r, _), p in sorted(gce.policies.items()) if matches(p, call.query.get("filter"))
    ]
    items, more = page(found, call, size)
    grouped: dict[str, dict[str, list[Any]]] = {}
    for region, policy in items:
        grouped.setdefault(f"regions/{region}", {"resourcePolicies": []})[
            "resourcePolicies"
        ].append(policy)
    return {"items": grouped, **more}


def _accelerators(gce: Gce, call: Call, size: int, zone: str | None) -> dict[str, Any]:
    found = [
        {
            "kind": "compute#acceleratorType",
            "name": kind,
            "zone": gce.link("zones", z),
            "maximumCardsPerInstance": most,
            "selfLink": gce.link("zones", z, "acceleratorTypes", kind),
        }
        for z, kinds in sorted(gce.zones.items())
        if zone in (None, z)
        for kind, most in sorted(kinds.items())
    ]
    found = [a for a in found if matches(a, call.query.get("filter"))]
    items, more = page(found, call, size)
    if zone is not None:
        return {"items": items, **more}
    grouped: dict[str, dict[str, list[Any]]] = {}
    for a in items:
        grouped.setdefault(f"zones/{a['zone'].rsplit('/', 1)[-1]}", {"acceleratorTypes": []})[
            "acceleratorTypes"
        ].append(a)
    return {"items": grouped, **more}
