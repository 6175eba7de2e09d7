"""The per-cluster resources besides instances: names, labels, firewall rules, placement policy.

GCE firewall rules and resource policies carry no labels, so they are found by **name**
(``cloudtrain-<cluster>-ssh``, ``-internal`` and ``-deny``; the policy ``cloudtrain-<cluster>``)
and their description records what the instances' labels (``cloudtrain-cluster``,
``cloudtrain-owner``, ``cloudtrain-cluster-id``) do: ``cloudtrain cluster=X owner=Y
cluster-id=Z`` (older ones lack the id). Named by the cluster alone, they are shared by every
incarnation of the name: the provider deletes them only when no one else holds it. Label values
allow only ``[a-z0-9_-]``: the owner (``user@host``) is written in that alphabet losslessly
(`owner_label`: ``user_40host``; before 2026-12 lossily, `legacy_owner_label`), and every
value pasted into a ``filter`` is checked to be in it (`label_value`), so none can close the
quoted string early.

**Firewall rules.** GCE takes the network's ingress rules that apply to an instance (its network
tag is a target, or the rule has none) and whose sources match, lowest priority number first; at
equal priority a deny wins; nothing matched is denied (the implied rule at 65535). Every other
rule of the network applies to the cluster's instances too: the ``default`` network's
``default-allow-ssh`` (tcp:22 from 0.0.0.0/0) and ``default-allow-internal`` (all from
10.128.0.0/9) at 65534, and any rule made without ``--priority`` (1000). An allow rule of ours
cannot narrow them, so each cluster has three rules, all targeting its tag:

===================  ========  ===================================================
rule                 priority  effect
===================  ========  ===================================================
``…-ssh``            900       allows tcp:22 from the caller's CIDR only
``…-internal``       900       allows everything from the cluster's own instances
``…-deny``           999       denies everything else (all protocols, 0.0.0.0/0)
===================  ========  ===================================================

Why 900 and 999: the deny must come before 1000, GCE's default priority, or every rule made
with the default would still reach the nodes; our allows must come before the deny (at equal
priority it would win). Rules at 999 and after (the default network's included) never reach
the nodes; an exception an administrator means (IAP's 35.235.240.0/20, a monitoring range)
still works when given a priority below 999. The nodes have no IPv6 address, so the deny
covers IPv4 only.

`ensure_firewalls` makes the rules what `firewall_bodies` says on every `up`: it creates a
missing rule and patches one whose priority, sources, targets, protocols or enabled state
differ (the SSH rule follows the caller's address; an older cloudtrain's rules at 1000 move to
900 and get their deny). `delete_all` deletes the deny rule last, so a half-deleted set never
leaves the nodes more open than before.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from cloudtrain.errors import ConfigError, ProviderError
from cloudtrain.providers.gcp._client import Clients, gcp_errors, import_compute, last

if TYPE_CHECKING:
    from google.cloud import compute_v1

LABEL_CLUSTER = "cloudtrain-cluster"
LABEL_OWNER = "cloudtrain-owner"
LABEL_CLUSTER_ID = "cloudtrain-cluster-id"
PREFIX = "cloudtrain-"
_DESCRIPTION = re.compile(
    r"^cloudtrain cluster=([a-z0-9-]+) owner=([a-z0-9_-]*)(?: cluster-id=([a-z0-9_-]+))?$"
)
#: A label value (GCE allows at most 63 of ``[a-z0-9_-]``), here never empty: every value
#: labelled or filtered by is a cluster name, an owner label, a cluster id or a GCE name.
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{1,63}")
_LABEL_MAX = 63
#: The characters an owner label keeps as they are (`owner_label`).
_KEPT_CHAR = re.compile(r"[a-z0-9-]")
ALLOW_PRIORITY = 900
DENY_PRIORITY = 999
ANYWHERE = "0.0.0.0/0"
#: The fields of a rule `ensure_firewalls` keeps as asked, with GCE's defaults (what a rule
#: read back has for a field its body left out).
_KEPT: dict[str, Any] = {
    "priority": 1000,
    "sourceRanges": [],
    "sourceTags": [],
    "targetTags": [],
    "allowed": [],
    "denied": [],
    "disabled": False,
}
_ROLES = {"ssh": "SSH rule", "internal": "internal rule", "deny": "deny rule"}


def resource_name(cluster: str) -> str:
    """The name of the cluster's network tag and placement policy."""
    return f"{PREFIX}{cluster}"


def firewall_names(cluster: str) -> tuple[str, str, str]:
    """The cluster's SSH, internal and deny rules, in the order they are made."""
    return f"{PREFIX}{cluster}-ssh", f"{PREFIX}{cluster}-internal", f"{PREFIX}{cluster}-deny"


def instance_name(cluster: str, index: int) -> str:
    """Instances are named by index: bulkInsert cannot label instances one by one."""
    return f"{PREFIX}{cluster}-{index}"


def index_of(cluster: str, name: str) -> int | None:
    head = f"{PREFIX}{cluster}-"
    tail = name[len(head) :] if name.startswith(head) else ""
    return int(tail) if tail.isdigit() else None


def owner_label(owner: str) -> str:
    """`owner` written losslessly in the label alphabet: lowercase letters, digits and ``-``
    as they are, every other character (``@``, ``.``, an uppercase letter, ``_`` itself) as
    ``_`` and the two hex digits of each of its UTF-8 bytes: ``alice@lab`` → ``alice_40lab``,
    ``alice.lab`` → ``alice_2elab``, ``Alice@Lab`` → ``_41lice_40_4cab`` (so two owners never
    write the same label, and each label reads back as its owner). One longer than 63 is cut
    (at a character) to leave room for ``__`` and 12 hex digits of the owner's SHA-256: no
    escape holds ``__``, so it is told from every label that is not cut, and from another cut
    one by the hash."""
    parts = [ch if _KEPT_CHAR.fullmatch(ch) else _escape(ch) for ch in owner]
    label = "".join(parts)
    if len(label) <= _LABEL_MAX:
        return label
    digest = hashlib.sha256(owner.encode()).hexdigest()[:12]
    room, cut = _LABEL_MAX - len(digest) - 2, ""
    for part in parts:
        if len(cut) + len(part) > room:
            break
        cut += part
    return f"{cut}__{digest}"


def legacy_owner_label(owner: str) -> str:
    """The owner label written before 2026-12 (lossy: lowercase, any other character as
    ``-``, so ``alice@lab``, ``alice.lab`` and ``Alice@Lab`` all wrote ``alice-lab``). Read
    only together with the cluster id (`cloudtrain.providers.gcp.provider`)."""
    return re.sub(r"[^a-z0-9_-]", "-", owner.lower())[:63]


def _escape(ch: str) -> str:
    return "".join(f"_{byte:02x}" for byte in ch.encode())


class Holder(NamedTuple):
    """Who made a resource, as it records it: the cluster, the owner label, and the cluster
    id ("" for a resource of an older version, made without one)."""

    cluster: str
    owner: str
    cluster_id: str


def label_value(value: str, what: str) -> str:
    """`value`, refused with a `ConfigError` naming it unless it is in the label alphabet: what
    may be labelled, written in a description, or pasted between the quotes of a ``filter``."""
    if not _LABEL_VALUE.fullmatch(value):
        raise ConfigError(
            f"{what} {value!r} is not in GCE's label alphabet (1 to 63 lowercase letters, "
            "digits, '_' and '-'); refused before it is sent"
        )
    return value


def labels(cluster: str, owner: str, cluster_id: str | None = None) -> dict[str, str]:
    found = {LABEL_CLUSTER: cluster, LABEL_OWNER: owner_label(owner)}
    if cluster_id is not None:
        found[LABEL_CLUSTER_ID] = label_value(cluster_id, "cluster id")
    return found


def description(cluster: str, owner: str, cluster_id: str | None = None) -> str:
    text = f"cloudtrain cluster={cluster} owner={owner_label(owner)}"
    if cluster_id is None:
        return text
    return f"{text} cluster-id={label_value(cluster_id, 'cluster id')}"


def parse_description(text: str) -> Holder | None:
    """Who made the resource, from a description written by `description` (one of an older
    version, without the id, reads with the id "")."""
    found = _DESCRIPTION.match(text or "")
    return Holder(found.group(1), found.group(2), found.group(3) or "") if found else None


def label_filter(key: str, value: str) -> str:
    """The ``filter`` of resources whose label `key` is `value` (checked: `label_value`)."""
    return f'labels.{key} = "{label_value(value, key)}"'


def name_filter(name: str) -> str:
    """The ``filter`` of resources named `name` (checked: `label_value`)."""
    return f'name = "{label_value(name, "name")}"'


def firewall_bodies(
    cluster: str, owner: str, cidr: str, network: str, cluster_id: str | None = None
) -> list[dict[str, Any]]:
    """Three rules (see the module docstring), in the order they are to be made: SSH from
    `cidr` only; everything between the cluster's instances (by network tag); then a deny of
    everything else (last: an older cluster's allows at 1000 reach 900 before it exists). The
    allows are two rules because one rule's ``allowed`` applies to all of its sources."""
    ssh, internal, deny = firewall_names(cluster)
    common = {
        "description": description(cluster, owner, cluster_id),
        "network": f"global/networks/{network}",
        "direction": "INGRESS",
        "targetTags": [resource_name(cluster)],
    }
    return [
        {
            "name": ssh,
            **common,
            "priority": ALLOW_PRIORITY,
            "sourceRanges": [cidr],
            "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
        },
        {
            "name": internal,
            **common,
            "priority": ALLOW_PRIORITY,
            "sourceTags": [resource_name(cluster)],
            "allowed": [{"IPProtocol": "all"}],
        },
        {
            "name": deny,
            **common,
            "priority": DENY_PRIORITY,
            "sourceRanges": [ANYWHERE],
            "denied": [{"IPProtocol": "all"}],
        },
    ]


def policy_body(cluster: str, owner: str, cluster_id: str | None = None) -> dict[str, Any]:
    """A compact placement policy: the cluster's VMs on nearby hosts (fast all-reduce)."""
    return {
        "name": resource_name(cluster),
        "description": description(cluster, owner, cluster_id),
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
) -> bool:
    """One mutating call, waited on; an error `done_already` accepts (the resource is there
    already, or gone already) is success: every `ensure`/`delete` here is idempotent. True
    when it was done already."""
    try:
        clients.wait(clients.mutate(what, call, where, **request), where, timeout_s)
    except ProviderError as exc:
        if not done_already(exc):
            raise
        return True
    return False


def ensure_firewalls(clients: Clients, bodies: list[dict[str, Any]], timeout_s: float) -> list[str]:
    """Make each rule what its body says: create it when missing, patch it when a field of
    `_KEPT` differs. Returns one line per rule created or changed (``[]``: all were as asked).
    Idempotent; blocks until each change is done; raises `ProviderError` (``FirewallDrift``
    for a field someone added that a patch cannot remove)."""
    compute = import_compute()
    changes: list[str] = []
    for body in bodies:
        name, where = body["name"], f"firewall {body['name']}"
        current = _read_firewall(clients, name)
        if current is None:
            made_meanwhile = _call_and_wait(
                clients,
                "firewalls.insert",
                clients.firewalls().insert_unary,
                where,
                timeout_s,
                done_already=_exists,
                project=clients.project,
                firewall_resource=compute.Firewall.from_json(json.dumps(body)),
            )
            if not made_meanwhile:
                changes.append(f"{_role(name)} {name} created: {_summary(_kept(body))}")
                continue
            current = _read_firewall(clients, name) or {}
        was, wanted = _kept(current), _kept(body)
        patch = _patch(name, was, wanted)
        if patch:
            resource = compute.Firewall.from_json(json.dumps(patch))
            call = clients.firewalls().patch_unary
            request = {"project": clients.project, "firewall": name, "firewall_resource": resource}
            clients.wait(
                clients.mutate("firewalls.patch", call, where, **request), where, timeout_s
            )
            changes.append(_changed(name, was, wanted, list(patch)))
    return changes


def _read_firewall(clients: Clients, name: str) -> dict[str, Any] | None:
    """The rule as GCE's JSON, or None when there is none."""
    compute = import_compute()
    try:
        with gcp_errors(f"firewall {name}"):
            rule = clients.firewalls().get(
                request={"project": clients.project, "firewall": name},
                timeout=clients.call_timeout_s,
            )
    except ProviderError as exc:
        if _gone(exc):
            return None
        raise
    found: dict[str, Any] = json.loads(compute.Firewall.to_json(rule))
    return found


def _kept(rule: dict[str, Any]) -> dict[str, Any]:
    """The fields of `_KEPT`, defaults filled in, protocols as ``{IPProtocol, ports}``."""
    kept = {key: rule.get(key, default) for key, default in _KEPT.items()}
    for key in ("allowed", "denied"):
        kept[key] = [
            {"IPProtocol": str(p["IPProtocol"]), "ports": [str(n) for n in p.get("ports") or []]}
            for p in kept[key]
        ]
    return kept


def _patch(name: str, was: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """The fields to send for `was` to become `wanted` (``{}``: nothing to do). A patch merges:
    a list left out, or empty (the SDK leaves empty lists out), stays as it was."""
    patch = {key: value for key, value in wanted.items() if was[key] != value}
    extra = [key for key, value in patch.items() if value == [] and was[key]]
    if extra:
        raise ProviderError(
            "gcp",
            "FirewallDrift",
            f"firewall rule {name} has {extra[0]} {_show(extra[0], was[extra[0]])} that "
            f"cloudtrain did not set and a patch cannot remove: delete the rule (gcloud compute "
            f"firewall-rules delete {name}) and run `cloudtrain up` again",
        )
    return patch


def _role(name: str) -> str:
    return _ROLES.get(name.rsplit("-", 1)[-1], "firewall rule")


def _show(key: str, value: Any) -> str:
    if key in ("allowed", "denied"):
        shown = [
            f"{p['IPProtocol']}:{','.join(p['ports'])}" if p["ports"] else p["IPProtocol"]
            for p in value
        ]
        return ", ".join(shown) or "nothing"
    if key == "sourceTags":
        return "instances tagged " + ", ".join(value) if value else "no tags"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    return str(value)


def _summary(rule: dict[str, Any]) -> str:
    """``allows tcp:22 from 203.0.113.7/32 (priority 900)``."""
    action = "denies" if rule["denied"] else "allows"
    protocols = _show("denied" if rule["denied"] else "allowed", rule["denied"] or rule["allowed"])
    sources = [*rule["sourceRanges"]]
    if rule["sourceTags"]:
        sources.append(_show("sourceTags", rule["sourceTags"]))
    return f"{action} {protocols} from {' and '.join(sources)} (priority {rule['priority']})"


def _changed(name: str, was: dict[str, Any], now: dict[str, Any], keys: list[str]) -> str:
    """``SSH rule cloudtrain-x-ssh now admits 198.51.100.9/32 (was 203.0.113.7/32)``."""
    words = {
        "priority": "now at priority",
        "sourceRanges": "now denies everything from" if now["denied"] else "now admits",
        "sourceTags": "now admits",
        "targetTags": "now applies to tags",
        "allowed": "now allows",
        "denied": "now denies",
    }
    parts = [
        ("enabled again" if not now[key] else "disabled")
        if key == "disabled"
        else f"{words[key]} {_show(key, now[key])} (was {_show(key, was[key])})"
        for key in keys
    ]
    return f"{_role(name)} {name} " + ", ".join(parts)


def ensure_policy(clients: Clients, region: str, body: dict[str, Any], timeout_s: float) -> None:
    compute = import_compute()
    policy = compute.ResourcePolicy.from_json(json.dumps(body))
    _call_and_wait(
        clients,
        "resourcePolicies.insert",
        clients.resource_policies().insert_unary,
        region,
        timeout_s,
        done_already=_exists,
        project=clients.project,
        region=region,
        resource_policy_resource=policy,
    )


def live_instances(clients: Clients, key: str, value: str) -> list[compute_v1.Instance]:
    """Every instance whose label `key` is `value`, in every zone (one paged aggregated list)."""
    request = {"project": clients.project, "filter": label_filter(key, value), "max_results": 500}
    with gcp_errors("instances.aggregatedList"):
        pager = clients.instances().aggregated_list(request=request)
        return [i for _, scoped in pager for i in scoped.instances]


def accelerator_zones(clients: Clients, accelerator_type: str) -> dict[str, int]:
    """Zone → the most cards of `accelerator_type` one instance may have there (one paged
    aggregated list: every zone of the project)."""
    request = {"project": clients.project, "filter": name_filter(accelerator_type)}
    with gcp_errors("acceleratorTypes.aggregatedList"):
        pager = clients.accelerator_types().aggregated_list(request=request)
        return {
            last(t.zone): int(t.maximum_cards_per_instance)
            for _, scoped in pager
            for t in scoped.accelerator_types
            if t.name == accelerator_type
        }


class Policy(NamedTuple):
    """A placement policy of the cluster's name; `holder` None when its description is not
    one cloudtrain writes."""

    region: str
    name: str
    holder: Holder | None


def policies(clients: Clients, cluster: str) -> list[Policy]:
    """The placement policies of the cluster's name, wherever they are, whoever made them."""
    request = {"project": clients.project, "filter": name_filter(resource_name(cluster))}
    with gcp_errors("resourcePolicies.aggregatedList"):
        pager = clients.resource_policies().aggregated_list(request=request)
        return [
            Policy(last(scope), p.name, parse_description(p.description))
            for scope, scoped in pager
            for p in scoped.resource_policies
        ]


def firewall_holders(clients: Clients) -> list[Holder]:
    """Who made each cloudtrain firewall rule of the project (one entry per rule)."""
    with gcp_errors("firewalls.list"):
        rules = clients.firewalls().list(request={"project": clients.project})
        found = [parse_description(r.description) for r in rules if r.name.startswith(PREFIX)]
    return [f for f in found if f is not None]


def delete_all(clients: Clients, cluster: str, timeout_s: float) -> None:
    """Delete the cluster's firewall rules and placement policies (after its instances: a
    policy in use cannot go); named by the cluster alone, they are every incarnation's, so the
    caller first checks that no one else holds the name. Idempotent."""
    for name in firewall_names(cluster):
        _call_and_wait(
            clients,
            "firewalls.delete",
            clients.firewalls().delete_unary,
            f"firewall {name}",
            timeout_s,
            done_already=_gone,
            project=clients.project,
            firewall=name,
        )
    for region, name, _ in policies(clients, cluster):
        _call_and_wait(
            clients,
            "resourcePolicies.delete",
            clients.resource_policies().delete_unary,
            region,
            timeout_s,
            done_already=_gone,
            project=clients.project,
            region=region,
            resource_policy=name,
        )
