"""What the user asks for: a cluster and a task, validated once and frozen.

Every check here runs before any provider is touched. A failed check raises `SpecError`, whose
message names the field, the bad value and what is allowed; `field` is the dotted path of the
field (``resources.accelerator``) so a YAML loader can point at the line it came from.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from cloudtrain.errors import SpecError as SpecError
from cloudtrain.errors import suggest
from cloudtrain.spec.frameworks import validate_runtime, validate_strategy
from cloudtrain.spec.limits import Limits, limits_from_dict, limits_of

NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,39}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_NODES = 1024
MAX_DISK_GB = 65536

# The fields of a task file, and of its `resources` block. Anything else is an error.
TASK_FIELDS = (
    *("name", "provider", "resources", "num_nodes", "workdir", "setup", "run", "envs"),
    *("checkpoint", "checkpoint_keep", "managed", "max_recoveries", "retry_on_failure"),
    *("idle_minutes", "down_when_idle", "max_hours", "max_cost", "runtime", "strategy"),
)
RESOURCE_FIELDS = ("accelerator", "spot", "region", "zone", "disk_gb", "image")


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Known:
    """The names a spec may use. Passed in, so that validating reads neither the catalog nor
    the provider registry (`cloudtrain.spec.taskfile.known` builds it from both)."""

    providers: Sequence[str]
    accelerators: Sequence[str]
    #: where a task that names no provider and no GPU goes (this machine)
    default: str
    #: the checkpoint buckets' schemes the plugins serve, each with its store's form and rule
    stores: Mapping[str, BucketStore] = field(default_factory=_empty)


@dataclass(frozen=True)
class Resources:
    """What one node has. `accelerator` None means a CPU-only node."""

    accelerator: str | None = None
    count: int = 0
    spot: bool = False
    region: str | None = None
    zone: str | None = None
    disk_gb: int = 200
    image: str | None = None

    @property
    def gpus(self) -> str | None:
        """The accelerator as the user writes it (``A100:8``), or None on CPU."""
        return f"{self.accelerator}:{self.count}" if self.accelerator else None


#: What `up` resolves into a spec and records, not what the user asks, and what a later `up`
#: may change in place (the limits: `up` hands the new ones to the nodes): never a difference.
_RESOLVED = ("ssh_cidr", "cluster_id", "limits.")


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster: a name, where, how many nodes and what each node has."""

    name: str
    provider: str
    num_nodes: int
    resources: Resources = field(default_factory=Resources)
    ssh_cidr: str | None = None
    extra: Mapping[str, Any] = field(default_factory=_empty)
    #: this incarnation of the name, on every resource's tags (`cloudtrain.model.new_cluster_id`):
    #: given by `up` to a new record and kept with it; None for records of older versions
    cluster_id: str | None = None
    #: when it stops billing by itself (`cloudtrain.spec.limits`)
    limits: Limits = field(default_factory=Limits)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, stable across versions; `from_dict` reads it back."""
        return {
            "name": self.name,
            "provider": self.provider,
            "num_nodes": self.num_nodes,
            "resources": dataclasses.asdict(self.resources),
            "ssh_cidr": self.ssh_cidr,
            "extra": dict(self.extra),
            "cluster_id": self.cluster_id,
            "limits": dataclasses.asdict(self.limits),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSpec:
        res = Resources(**data.get("resources", {}))
        return cls(
            name=data["name"],
            provider=data["provider"],
            num_nodes=int(data["num_nodes"]),
            resources=res,
            ssh_cidr=data.get("ssh_cidr"),
            extra=MappingProxyType(dict(data.get("extra", {}))),
            cluster_id=data.get("cluster_id"),
            limits=limits_of(data.get("limits")),
        )

    def differences(self, other: ClusterSpec) -> list[str]:
        """Readable differences (``num_nodes: 2 → 3``); empty when both describe one cluster.
        Where SSH is allowed from is not one: `up` changes the rule in place (and the caller's
        address, the default, moves); nor is the cluster id, which a request never carries."""
        mine, theirs = _flatten(self.to_dict()), _flatten(other.to_dict())
        return [
            f"{key}: {mine.get(key)!r} → {theirs.get(key)!r}"
            for key in sorted(set(mine) | set(theirs))
            if mine.get(key) != theirs.get(key) and not key.startswith(_RESOLVED)
        ]


@dataclass(frozen=True)
class TaskSpec:
    """A task: the cluster it needs and what to run on it."""

    cluster: ClusterSpec
    workdir: Path | None = None
    setup: str | None = None
    run: str | None = None
    envs: Mapping[str, str] = field(default_factory=_empty)
    #: a bucket (``s3://BUCKET/PREFIX``) that also keeps the job's checkpoints
    checkpoint: str | None = None
    #: how many of the newest checkpoints are kept (here and in the bucket)
    checkpoint_keep: int = 2
    #: ``num_nodes: MIN:MAX``: an elastic job, which goes on while MIN nodes are left
    min_nodes: int | None = None
    #: a managed job (`cloudtrain.jobs.managed`), recovered up to `max_recoveries` times
    managed: bool = False
    max_recoveries: int | None = None
    retry_on_failure: bool = False
    #: what starts the processes (`cloudtrain.spec.frameworks`), and a torch job's strategy
    runtime: str = "torch"
    strategy: str | None = None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _matching(value: object, pattern: re.Pattern[str], field: str, message: str) -> str:
    """`value` when it is a string that `pattern` matches whole; else `SpecError(message)`."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise SpecError(field, message)
    return value


def validate_name(name: object, field: str = "name") -> str:
    """A cluster name that is safe as a cloud tag value, a label and a hostname."""
    return _matching(
        name, NAME_RE, field,
        f"{field} {name!r} is not a valid cluster name: use 1 to 40 characters, lowercase "
        "letters, digits and '-', starting with a letter (e.g. 'exp1', 'bert-large')",
    )  # fmt: skip


#: A job's id: its cluster's name and a sequence number (``exp1-3``).
JOB_ID_RE = re.compile(r"[a-z][a-z0-9-]{0,39}-[0-9]{1,9}")


def validate_job_id(value: object, field: str = "job id") -> str:
    """A job id as `State` makes them; anything else is refused before it is looked up."""
    return _matching(
        value, JOB_ID_RE, field,
        f"{field} {value!r} is not a job id: a cluster name, '-' and a number (e.g. 'exp1-3'); "
        "`cloudtrain status` lists jobs",
    )  # fmt: skip


#: A checkpoint bucket URL's scheme and bucket, as any object storage writes them; each store's
#: own rule (its plugin's `Store.refused`) narrows the bucket and prefix further.
_SCHEME_RE = re.compile(r"[a-z][a-z0-9]{0,15}")
_BUCKET_PART_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,221}")
#: A key prefix's parts: the characters every object storage takes unescaped.
_KEY_PART_RE = re.compile(r"[A-Za-z0-9!_.*'()-]+")

#: Why a store refuses a URL (a clause naming what it allows), or None: a plugin's rule.
BucketRule = Callable[["BucketURL"], str | None]


class BucketStore(Protocol):
    """What validating a bucket URL needs of the store that serves its scheme."""

    @property
    def form(self) -> str:
        """What follows ``SCHEME://`` in its URLs, for the user (``BUCKET/PREFIX``)."""

    @property
    def refused(self) -> BucketRule:
        """Its rule for the URL's bucket and prefix."""


@dataclass(frozen=True)
class BucketURL:
    """Where a bucket keeps checkpoints: ``SCHEME://BUCKET/PREFIX`` (`prefix` may be empty; the
    scheme names the object storage, whose plugin's `Store` serves it)."""

    bucket: str
    prefix: str = ""
    scheme: str = "s3"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")


def parse_bucket_url(
    value: object, field: str = "checkpoint", stores: Mapping[str, BucketStore] | None = None
) -> BucketURL:
    """``SCHEME://BUCKET[/PREFIX]``: a prefix of parts made of letters, digits and
    ``!_.*'()-`` (no empty, ``.`` or ``..`` part). With `stores` (each served scheme's store),
    the scheme must be one of them and the URL what its store allows."""
    forms = sorted(f"{scheme}://{store.form}" for scheme, store in (stores or {}).items())
    served = ", ".join(forms) or "SCHEME://BUCKET/PREFIX"
    allowed = f"write {served}, with a prefix of letters, digits and !_.*'()- between '/'"
    scheme, sep, rest = value.partition("://") if isinstance(value, str) else ("", "", "")
    if not sep or not _SCHEME_RE.fullmatch(scheme):
        raise SpecError(field, f"{field} {value!r} is not a bucket URL; {allowed}")
    if stores is not None and scheme not in stores:
        raise SpecError(
            field, f"{field} {value!r}: no provider keeps checkpoints at {scheme}://; {allowed}"
        )
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_PART_RE.fullmatch(bucket):
        raise SpecError(field, f"{field} {value!r}: {bucket!r} is not a bucket name; {allowed}")
    prefix = prefix.rstrip("/")
    parts = prefix.split("/") if prefix else []
    bad = [p for p in parts if not _KEY_PART_RE.fullmatch(p) or p in (".", "..")]
    if bad:
        raise SpecError(
            field, f"{field} {value!r}: the prefix part {bad[0]!r} is not allowed; {allowed}"
        )
    if len(prefix) > 512:
        raise SpecError(field, f"{field} {value!r}: the prefix is longer than 512 characters")
    url = BucketURL(bucket, prefix, scheme)
    refused = stores[scheme].refused(url) if stores is not None else None
    if refused:
        raise SpecError(field, f"{field} {value!r}: {refused}")
    return url


def _whole(value: object, field: str, minimum: int, meaning: str = "") -> int:
    """`value` when it is a whole number of at least `minimum` (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(
            field, f"{field} {value!r} is not allowed; use a whole number of {minimum} or more"
            + (f" ({meaning})" if meaning else ""),
        )  # fmt: skip
    return value


def validate_checkpoint_keep(value: object, field: str = "checkpoint_keep") -> int:
    """How many of a job's newest checkpoints are kept: a whole number, 1 or more."""
    return _whole(value, field, 1, "how many of the newest checkpoints are kept")


def parse_gpus(
    value: str, known: Sequence[str], field: str = "resources.accelerator"
) -> tuple[str, int]:
    """``A100:8`` → ("A100", 8); a bare ``A100`` means one GPU. The name must be one of
    `known` (the catalog's accelerators)."""
    text = value.strip()
    name, sep, count_text = text.partition(":")
    canonical = {k.lower(): k for k in known}.get(name.lower())
    if canonical is None:
        raise SpecError(
            field,
            f"{field} {value!r}: unknown accelerator {name!r}{suggest(name, known)}; "
            f"known: {', '.join(known)} (write NAME:COUNT, e.g. A100:8)",
        )
    if not sep:
        return canonical, 1
    try:
        count = int(count_text)
    except ValueError:
        raise SpecError(
            field,
            f"{field} {value!r}: the GPU count {count_text!r} is not a whole number "
            "(write NAME:COUNT, e.g. A100:8)",
        ) from None
    if count < 1:
        raise SpecError(field, f"{field} {value!r}: the GPU count must be at least 1 (got {count})")
    return canonical, count


def validate_env_name(name: object, field: str = "envs", label: str | None = None) -> str:
    """An environment variable's name, which no ``env`` reads as an option (the one rule for
    task files' `envs:` and ``--env``); the message starts with `label` (default `field`)."""
    return _matching(
        name, ENV_NAME_RE, field,
        f"{label or field}: {name!r} is not a valid environment variable name (letters, "
        "digits and '_', not starting with a digit)",
    )  # fmt: skip


_NODES_RE = re.compile(r"(?:([0-9]{1,6}):)?([0-9]{1,6})")


def parse_nodes(value: object, field: str = "--nodes") -> tuple[int | None, int]:
    """``N`` or ``MIN:MAX`` (an elastic job: it goes on while MIN of its MAX nodes are left)
    as (MIN or None, MAX); `SpecError` naming `field` for anything else."""
    text = str(value)
    found = _NODES_RE.fullmatch(text)  # digits only: int() would take " 2\n" or "+2"
    low = int(found[1]) if found and found[1] else None
    high = int(found[2]) if found else 0
    bad_low = low is not None and not 1 <= low <= high
    if isinstance(value, bool) or not 1 <= high <= MAX_NODES or bad_low:
        raise SpecError(
            field,
            f"{field} {text!r}: write a number of nodes (2) or MIN:MAX with 1 <= MIN <= MAX <= "
            f"{MAX_NODES} (1:4, an elastic job that goes on while 1 of its 4 nodes is left)",
        )
    return low, high


def _flag(data: Mapping[str, Any], field: str) -> bool:
    value = data.get(field, False)
    if not isinstance(value, bool):
        raise SpecError(field, f"{field} {value!r} is not allowed; use true or false")
    return value


def _max_recoveries(data: Mapping[str, Any]) -> int | None:
    value = data.get("max_recoveries")
    return None if value is None else _whole(value, "max_recoveries", 0)


def validate_num_nodes(value: object, field: str = "num_nodes") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise SpecError(
                field, f"{field} {value!r} is not a whole number; allowed: 1 to {MAX_NODES}"
            ) from None
    if not 1 <= value <= MAX_NODES:
        raise SpecError(field, f"{field} {value} is out of range; allowed: 1 to {MAX_NODES}")
    return value


#: The provider of a spec that leaves the choice of cloud to the optimizer (`cloudtrain
#: .plan.optimizer`): what `up --gpus …` means when no provider is named.
ANYWHERE = "any"


def validate_provider(
    value: object, known: Sequence[str], field: str = "provider", also: Sequence[str] = ()
) -> str:
    """`value` if it is one of the `known` provider names or `also` (asked by membership
    first: the registry lists its plugins only when it must)."""
    if isinstance(value, str) and (value in also or value in known):
        return value
    names = [*known, *also]
    shown = value if isinstance(value, str) else repr(value)
    hint = suggest(value, names) if isinstance(value, str) else ""
    raise SpecError(
        field, f"{field} {shown!r} is not a known provider{hint}; known: {', '.join(names)}"
    )


def _opt_str(data: Mapping[str, Any], key: str, field: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SpecError(field, f"{field} {value!r} must be a non-empty string")
    return value


def _bool(data: Mapping[str, Any], key: str, field: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise SpecError(field, f"{field} {value!r} must be true or false")
    return value


def resources_from_dict(
    data: Mapping[str, Any], accelerators: Sequence[str], prefix: str = "resources."
) -> Resources:
    unknown = [k for k in data if k not in RESOURCE_FIELDS]
    if unknown:
        key = str(unknown[0])
        raise SpecError(
            prefix + key,
            f"unknown field {prefix + key!r}{suggest(key, RESOURCE_FIELDS)}; "
            f"allowed: {', '.join(RESOURCE_FIELDS)}",
        )
    accelerator, count = None, 0
    raw_acc = data.get("accelerator")
    if raw_acc is not None:
        if not isinstance(raw_acc, str):
            raise SpecError(
                prefix + "accelerator",
                f"{prefix}accelerator {raw_acc!r} must be a string like 'A100:8'",
            )
        accelerator, count = parse_gpus(raw_acc, accelerators, prefix + "accelerator")
    disk = data.get("disk_gb", 200)
    if isinstance(disk, bool) or not isinstance(disk, int) or not 10 <= disk <= MAX_DISK_GB:
        raise SpecError(
            prefix + "disk_gb",
            f"{prefix}disk_gb {disk!r} is not allowed; use a whole number of GB from 10 to "
            f"{MAX_DISK_GB}",
        )
    return Resources(
        accelerator=accelerator,
        count=count,
        spot=_bool(data, "spot", prefix + "spot"),
        region=_opt_str(data, "region", prefix + "region"),
        zone=_opt_str(data, "zone", prefix + "zone"),
        disk_gb=disk,
        image=_opt_str(data, "image", prefix + "image"),
    )


def _run(data: Mapping[str, Any]) -> str | None:
    """`run:`, which must split into words as a shell would (it becomes the job's argv)."""
    import shlex

    run = _opt_str(data, "run", "run")
    if run is not None:
        try:
            shlex.split(run)
        except ValueError as exc:
            raise SpecError("run", f"run {run!r}: {str(exc).lower()}") from None
    return run


def _checkpoint(data: Mapping[str, Any], known: Known) -> str | None:
    """`checkpoint:` as a normalized bucket URL, or None."""
    value = data.get("checkpoint")
    return None if value is None else str(parse_bucket_url(value, stores=known.stores))


def task_from_dict(
    data: Mapping[str, Any], known: Known, *, base_dir: Path | None = None
) -> TaskSpec:
    """Validate a task mapping (a parsed task file with flags applied) into a `TaskSpec`.

    `known` holds the provider and accelerator names a task may use; `base_dir` is where a
    relative `workdir` is resolved from (the task file's folder).
    """
    unknown = [k for k in data if k not in TASK_FIELDS]
    if unknown:
        key = str(unknown[0])
        raise SpecError(
            key,
            f"unknown field {key!r}{suggest(key, TASK_FIELDS)}; allowed: {', '.join(TASK_FIELDS)}",
        )
    name = validate_name(data.get("name"))
    asked = data.get("provider")
    provider = None
    if asked is not None:
        provider = validate_provider(asked, known.providers, also=(ANYWHERE,))
    raw_nodes = data.get("num_nodes", 1)
    min_nodes = None
    if isinstance(raw_nodes, str) and ":" in raw_nodes:
        min_nodes, num_nodes = parse_nodes(raw_nodes, "num_nodes")
    else:
        num_nodes = validate_num_nodes(raw_nodes)
    raw_res = data.get("resources") or {}
    if not isinstance(raw_res, Mapping):
        raise SpecError("resources", f"resources must be a mapping, got {raw_res!r}")
    resources = resources_from_dict(raw_res, known.accelerators)
    if provider is None:  # GPUs are where the clouds are; without them, this machine
        provider = ANYWHERE if resources.accelerator else known.default
    elif provider == ANYWHERE and not resources.accelerator:
        raise SpecError(
            "provider",
            "provider 'any' chooses among the clouds' GPU machines: give resources.accelerator "
            "(--gpus, e.g. A100:8), or name a provider",
        )
    workdir = None
    raw_wd = _opt_str(data, "workdir", "workdir")
    if raw_wd is not None:
        workdir = (base_dir or Path.cwd()) / Path(raw_wd).expanduser()
        if not workdir.is_dir():
            raise SpecError("workdir", f"workdir {raw_wd!r} is not a directory ({workdir})")
        workdir = workdir.resolve()
    envs_raw = data.get("envs") or {}
    if not isinstance(envs_raw, Mapping):
        raise SpecError("envs", f"envs must be a mapping of NAME: value, got {envs_raw!r}")
    envs: dict[str, str] = {}
    for key, value in envs_raw.items():
        validate_env_name(key, f"envs.{key}", "envs")
        if isinstance(value, Mapping | list):
            raise SpecError(f"envs.{key}", f"envs.{key} must be a string or number")
        if value is None:
            envs[key] = ""
        else:
            envs[key] = str(value).lower() if isinstance(value, bool) else str(value)
    cluster = ClusterSpec(name=name, provider=provider, num_nodes=num_nodes, resources=resources,
                          limits=limits_from_dict(data))  # fmt: skip
    runtime = validate_runtime(data.get("runtime", "torch"))
    strategy = data.get("strategy")
    return TaskSpec(
        cluster=cluster,
        workdir=workdir,
        setup=_opt_str(data, "setup", "setup"),
        run=_run(data),
        envs=MappingProxyType(envs),
        checkpoint=_checkpoint(data, known),
        checkpoint_keep=validate_checkpoint_keep(data.get("checkpoint_keep", 2)),
        min_nodes=min_nodes,
        managed=_flag(data, "managed"),
        max_recoveries=_max_recoveries(data),
        retry_on_failure=_flag(data, "retry_on_failure"),
        runtime=runtime,
        strategy=None if strategy is None else validate_strategy(strategy, runtime),
    )
