"""The per-cluster resources besides instances: names, labels, firewall rules, placement policy.

GCE firewall rules and resource policies carry no labels, so they are found by **name**
(``cloudtrain-<cluster>-ssh``, ``cloudtrain-<cluster>-internal``, ``cloudtrain-<cluster>``) and
their description records the cluster and owner (for `clusters()`). Label values allow only
``[a-z0-9_-]``: the owner (``user@host``) is written in that alphabet (`owner_label`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import ProviderError
from cloudtrain.providers.gcp._client import Clients, gcp_errors, import_compute, last

if TYPE_CHECKING:
    from google.cloud import compute_v1

LABEL_CLUSTER = "cloudtrain-cluster"
LABEL_OWNER = "cloudtrain-owner"
PREFIX = "cloudtrain-"
_DESCRIPTION = re.compile(r"^cloudtrain cluster=([a-z0-9-]+) owner=([a-z0-9_-]*)$")


def resource_name(cluster: str) -> str:
    """The name of the cluster's network tag and placement policy."""
    return f"{PREFIX}{cluster}"


def firewall_names(cluster: str) -> tuple[str, str]:
    return f"{PREFIX}{cluster}-ssh", f"{PREFIX}{cluster}-internal"


def instance_name(cluster: str, index: int) -> str:
    """Instances are named by index: bulkInsert cannot label instances one by one."""
    return f"{PREFIX}{cluster}-{index}"


def index_of(cluster: str, name: str) -> int | None:
    head = f"{PREFIX}{cluster}-"
    tail = name[len(head) :] if name.startswith(head) else ""
    return int(tail) if tail.isdigit() else None


def owner_label(owner: str) -> str:
    """`owner` in the label alphabet: lowercase, anything else as ``-``, at most 63 chars."""
    return re.sub(r"[^a-z0-9_-]", "-", owner.lower())[:63]


def labels(cluster: str, owner: str) -> dict[str, str]:
    return {LABEL_CLUSTER: cluster, LABEL_OWNER: owner_label(owner)}


def description(cluster: str, owner: str) -> str:
    return f"cloudtrain cluster={cluster} owner={owner_label(owner)}"


def parse_description(text: str) -> tuple[str, str] | None:
    """(cluster, owner label) from a description written by `description`."""
    found = _DESCRIPTION.match(text or "")
    return (found.group(1), found.group(2)) if found else None


def label_filter(key: str, value: str) -> str:
    return f'labels.{key} = "{value}"'


def firewall_bodies(cluster: str, owner: str, cidr: str, network: str) -> list[dict[str, Any]]:
    """Two rules: SSH from `cidr` only, and everything between the cluster's instances (by
    network tag). One rule cannot say both: its ``allowed`` applies to all of its sources."""
    ssh, internal = firewall_names(cluster)
    common = {
        "description": description(cluster, owner),
        "network": f"global/networks/{network}",
        "direction": "INGRESS",
        "priority": 1000,
        "targetTags": [resource_name(cluster)],
    }
    return [
        {
            "name": ssh,
            **common,
            "sourceRanges": [cidr],
            "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
        },
        {
            "name": internal,
            **common,
            "sourceTags": [resource_name(cluster)],
            "allowed": [{"IPProtocol": "all"}],
        },
    ]


def policy_body(cluster: str, owner: str) -> dict[str, Any]:
    """A compact placement policy: the cluster's VMs on nearby hosts (fast all-reduce)."""
    return {
        "name": resource_name(cluster),
        "description": description(cluster, owner),
        "groupPlacementPolicy": {"collocation": "COLLOCATED"},
    }


def _exists(exc: ProviderError) -> bool:
    return exc.code in ("ALREADY_EXISTS", "HTTP_409")


def _gone(exc: ProviderError) -> bool:
    return exc.code in ("NOT_FOUND", "HTTP_404")


def _call_and_wait(
    clients: Clients,
    what: str,
    call: Callable[..., Any],
    where: str,
    timeout_s: float,
    *,
    done_already: Callable[[ProviderError], bool],
    **request: Any,
) -> None:
    """One mutating call, waited on; an error `done_already` accepts (the resource is there
    already, or gone already) is success: every `ensure`/`delete` here is idempotent."""
    try:
        clients.wait(clients.mutate(what, call, where, **request), where, timeout_s)
    except ProviderError as exc:
        if not done_already(exc):
            raise


def ensure_firewalls(clients: Clients, bodies: list[dict[str, Any]], timeout_s: float) -> None:
    """Create each rule unless it exists. Idempotent."""
    compute = import_compute()
    for body in bodies:
        _call_and_wait(
            clients, "firewalls.insert", clients.firewalls().insert_unary,
            f"firewall {body['name']}", timeout_s, done_already=_exists,
            project=clients.project, firewall_resource=compute.Firewall.from_json(json.dumps(body)),
        )  # fmt: skip


def ensure_policy(clients: Clients, region: str, body: dict[str, Any], timeout_s: float) -> None:
    compute = import_compute()
    policy = compute.ResourcePolicy.from_json(json.dumps(body))
    _call_and_wait(
        clients, "resourcePolicies.insert", clients.resource_policies().insert_unary, region,
        timeout_s, done_already=_exists,
        project=clients.project, region=region, resource_policy_resource=policy,
    )  # fmt: skip


def live_instances(clients: Clients, key: str, value: str) -> list[compute_v1.Instance]:
    """Every instance whose label `key` is `value`, in every zone (one paged aggregated list)."""
    request = {"project": clients.project, "filter": label_filter(key, value), "max_results": 500}
    with gcp_errors("instances.aggregatedList"):
        pager = clients.instances().aggregated_list(request=request)
        return [i for _, scoped in pager for i in scoped.instances]


def accelerator_zones(clients: Clients, accelerator_type: str) -> dict[str, int]:
    """Zone → the most cards of `accelerator_type` one instance may have there (one paged
    aggregated list: every zone of the project)."""
    request = {"project": clients.project, "filter": f'name = "{accelerator_type}"'}
    with gcp_errors("acceleratorTypes.aggregatedList"):
        pager = clients.accelerator_types().aggregated_list(request=request)
        return {
            last(t.zone): int(t.maximum_cards_per_instance)
            for _, scoped in pager
            for t in scoped.accelerator_types
            if t.name == accelerator_type
        }


def policies(clients: Clients, cluster: str) -> list[tuple[str, str]]:
    """(region, name) of the cluster's placement policies, wherever they are."""
    request = {"project": clients.project, "filter": f'name = "{resource_name(cluster)}"'}
    with gcp_errors("resourcePolicies.aggregatedList"):
        pager = clients.resource_policies().aggregated_list(request=request)
        return [(last(scope), p.name) for scope, scoped in pager for p in scoped.resource_policies]


def firewall_owners(clients: Clients) -> list[tuple[str, str]]:
    """(cluster, owner label) of every cloudtrain firewall rule of the project."""
    with gcp_errors("firewalls.list"):
        rules = clients.firewalls().list(request={"project": clients.project})
        found = [parse_description(r.description) for r in rules if r.name.startswith(PREFIX)]
    return [f for f in found if f is not None]


def delete_all(clients: Clients, cluster: str, timeout_s: float) -> None:
    """Delete the cluster's firewall rules and placement policies (after its instances: a
    policy in use cannot go). Idempotent."""
    for name in firewall_names(cluster):
        _call_and_wait(
            clients, "firewalls.delete", clients.firewalls().delete_unary, f"firewall {name}",
            timeout_s, done_already=_gone, project=clients.project, firewall=name,
        )  # fmt: skip
    for region, name in policies(clients, cluster):
        _call_and_wait(
            clients, "resourcePolicies.delete", clients.resource_policies().delete_unary, region,
            timeout_s, done_already=_gone,
            project=clients.project, region=region, resource_policy=name,
        )  # fmt: skip
