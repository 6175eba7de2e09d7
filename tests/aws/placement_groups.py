"""Placement groups: the EC2 API that moto 5.2.5 lacks.

moto has no ``CreatePlacementGroup``, ``DescribePlacementGroups`` or ``DeletePlacementGroup``
(in process they raise ``NotImplementedError``; over HTTP moto answers a 500 HTML page that
botocore cannot parse), and ``RunInstances`` accepts ``Placement.GroupName`` and drops it. This
store keeps groups per region and answers those three actions in EC2's XML. The stand-in's
middleware also asks it to check the group a ``RunInstances`` names (an unknown one is refused, as
EC2 does) and tells it which instances were launched into which group, so that deleting a group
that still holds a live instance is refused with ``InvalidPlacementGroup.InUse``.

Supported: strategies ``cluster``/``spread``/``partition`` (``PartitionCount``, ``SpreadLevel``),
tags given at creation (``TagSpecification.N`` of type ``placement-group``), ``DryRun``, lookups
by ``GroupName.N`` / ``GroupId.N``, and filters ``group-name``, ``group-arn``, ``state``,
``strategy``, ``spread-level``, ``tag:KEY``, ``tag-key``, ``tag-value`` (``*``/``?`` wildcards).
Not supported: ``CreateTags`` on a group id, linked/parent groups.
"""

from __future__ import annotations

import fnmatch
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.aws.ec2_query import (
    Ec2Error,
    element,
    filters,
    listed,
    response_xml,
    tag_set,
    tag_specification,
)

ACTIONS = frozenset({"CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup"})
STRATEGIES = frozenset({"cluster", "spread", "partition"})


@dataclass
class PlacementGroup:
    name: str
    group_id: str
    strategy: str
    region: str
    account: str
    tags: dict[str, str] = field(default_factory=dict)
    partition_count: int | None = None
    spread_level: str | None = None
    state: str = "available"
    instance_ids: set[str] = field(default_factory=set)

    @property
    def arn(self) -> str:
        return f"arn:aws:ec2:{self.region}:{self.account}:placement-group/{self.name}"

    def xml(self) -> str:
        return (
            element("groupName", self.name)
            + element("groupId", self.group_id)
            + element("groupArn", self.arn)
            + element("strategy", self.strategy)
            + element("state", self.state)
            + element("partitionCount", self.partition_count)
            + element("spreadLevel", self.spread_level)
            + tag_set(self.tags)
        )

    def filter_value(self, name: str) -> list[str]:
        """The values a ``Filter.N.Name`` of ``name`` is matched against."""
        if name.startswith("tag:"):
            key = name[len("tag:") :]
            return [self.tags[key]] if key in self.tags else []
        values = {
            "group-name": [self.name],
            "group-arn": [self.arn],
            "state": [self.state],
            "strategy": [self.strategy],
            "spread-level": [self.spread_level or ""],
            "tag-key": list(self.tags),
            "tag-value": list(self.tags.values()),
        }
        if name not in values:
            raise Ec2Error("InvalidParameterValue", f"The filter '{name}' is invalid")
        return values[name]


def _unknown(name: str) -> Ec2Error:
    return Ec2Error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")


class PlacementGroups:
    """Placement groups per region. Thread-safe: the server answers requests in threads.

    ``is_live(region, instance_id)`` says whether an instance still holds its group (any state
    but ``terminated``); the stand-in asks moto.
    """

    def __init__(self, is_live: Callable[[str, str], bool]) -> None:
        self._is_live = is_live
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, PlacementGroup]] = {}

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()

    def in_region(self, region: str) -> list[PlacementGroup]:
        with self._lock:
            return list(self._groups.get(region, {}).values())

    def handle(self, action: str, params: dict[str, str], region: str, account: str) -> bytes:
        """Answers one of ``ACTIONS`` with EC2 XML; raises ``Ec2Error`` as EC2 would."""
        if params.get("DryRun") == "true":
            raise Ec2Error(
                "DryRunOperation", "Request would have succeeded, but DryRun flag is set.", 412
            )
        with self._lock:
            groups = self._groups.setdefault(region, {})
            if action == "CreatePlacementGroup":
                group = self._create(groups, params, region, account)
                return response_xml(action, f"<placementGroup>{group.xml()}</placementGroup>")
            if action == "DescribePlacementGroups":
                found = self._describe(groups, params)
                items = "".join(f"<item>{g.xml()}</item>" for g in found)
                return response_xml(action, f"<placementGroupSet>{items}</placementGroupSet>")
            self._delete(groups, params.get("GroupName", ""), region)
            return response_xml(action, "<return>true</return>")

    def _create(
        self, groups: dict[str, PlacementGroup], params: dict[str, str], region: str, account: str
    ) -> PlacementGroup:
        name = params.get("GroupName")
        if not name:
            raise Ec2Error("MissingParameter", "The request must contain the parameter groupName")
        strategy = params.get("Strategy", "")
        if strategy not in STRATEGIES:
            raise Ec2Error("InvalidParameterValue", f"Invalid placement strategy: '{strategy}'")
        if name in groups:
            raise Ec2Error(
                "InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists."
            )
        count = params.get("PartitionCount")
        group = PlacementGroup(
            name=name,
            group_id="pg-" + secrets.token_hex(9)[:17],
            strategy=strategy,
            region=region,
            account=account,
            tags=tag_specification(params, "placement-group"),
            partition_count=int(count) if count and strategy == "partition" else None,
            spread_level=params.get("SpreadLevel") if strategy == "spread" else None,
        )
        groups[name] = group
        return group

    def _describe(
        self, groups: dict[str, PlacementGroup], params: dict[str, str]
    ) -> list[PlacementGroup]:
        found = list(groups.values())
        names, ids = listed(params, "GroupName"), listed(params, "GroupId")
        for name in names:
            if name not in groups:
                raise _unknown(name)
        by_id = {g.group_id: g for g in found}
        for group_id in ids:
            if group_id not in by_id:
                raise _unknown(group_id)
        if names or ids:
            found = [g for g in found if g.name in names or g.group_id in ids]
        for name, patterns in filters(params).items():
            found = [
                g
                for g in found
                if any(fnmatch.fnmatchcase(v, p) for v in g.filter_value(name) for p in patterns)
            ]
        return found

    def _delete(self, groups: dict[str, PlacementGroup], name: str, region: str) -> None:
        group = groups.get(name)
        if group is None:
            raise _unknown(name)
        group.instance_ids = {i for i in group.instance_ids if self._is_live(region, i)}
        if group.instance_ids:
            raise Ec2Error(
                "InvalidPlacementGroup.InUse",
                f"The placement group '{name}' is in use and may not be deleted.",
            )
        del groups[name]

    def for_launch(self, params: dict[str, str], region: str) -> PlacementGroup | None:
        """The group a ``RunInstances`` names in ``Placement.GroupName``/``GroupId``, if any.

        Raises ``Ec2Error`` (``InvalidPlacementGroup.Unknown``) for a group that does not exist.
        """
        name, group_id = params.get("Placement.GroupName"), params.get("Placement.GroupId")
        if not name and not group_id:
            return None
        with self._lock:
            for group in self._groups.get(region, {}).values():
                if group.name == name or group.group_id == group_id:
                    return group
        raise _unknown(name or group_id or "")

    def launched(self, group: PlacementGroup, instance_ids: list[str]) -> None:
        with self._lock:
            group.instance_ids.update(instance_ids)
