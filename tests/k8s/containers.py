"""What the stand-in's kubelet knows of a pod: its containers, their runs (instances) and logs,
and how that reads as the pod's status and a container's environment (no threads started here
but the log readers)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from tests.k8s.store import Obj, Store, now

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LINE = 16 * 1024  # a longer line is logged in parts, as the CRI does


class ConfigError(Exception):
    """A container cannot be configured yet (a missing Secret or key): it waits."""


@dataclass
class Instance:
    """One run of a container: its process, its log, and what became of it."""

    number: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: str = ""
    done: threading.Event = field(default_factory=threading.Event)  # its output fully logged
    terminated: Obj | None = None


@dataclass
class Container:
    spec: Obj
    instances: list[Instance] = field(default_factory=list)
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    finished: bool = False  # terminated and will not restart
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def current(self) -> Instance | None:
        return self.instances[-1] if self.instances else None

    def state(self) -> tuple[Obj, Obj]:
        """(state, lastState) as the container status writes them."""
        done = [i.terminated for i in self.instances if i.terminated]
        current = self.current
        if self.waiting is not None:
            reason, message = self.waiting
            waiting = {"reason": reason, **({"message": message} if message else {})}
            return {"waiting": waiting}, ({"terminated": done[-1]} if done else {})
        assert current is not None
        if current.terminated is None:
            return {"running": {"startedAt": current.started}}, (
                {"terminated": done[-1]} if done else {}
            )
        return {"terminated": current.terminated}, (
            {"terminated": done[-2]} if len(done) > 1 else {}
        )


@dataclass
class PodRun:
    """A pod as the kubelet runs it."""

    namespace: str
    name: str
    uid: str
    node: str
    ip: str
    host_ip: str
    folder: Path
    logs: Path
    containers: dict[str, Container]
    restart: str
    stop: threading.Event = field(default_factory=threading.Event)
    silent: bool = False  # its node is lost: no status comes from it any more
    lock: threading.Lock = field(default_factory=threading.Lock)
    # every exec's session → its container: what an exec left running dies with the container
    execs: dict[int, str] = field(default_factory=dict)
    dead: bool = False  # its containers were killed: nothing more may start in it


def environment(store: Store, api: tuple[str, int], run: PodRun, spec: Obj) -> dict[str, str]:
    """A container's environment: the base, then ``envFrom``, then ``env``."""
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:{BASE_PATH}",
        "LANG": "C.UTF-8",
        "HOME": str(run.folder),
        "HOSTNAME": run.name,
        "KUBERNETES_SERVICE_HOST": api[0],
        "KUBERNETES_SERVICE_PORT": str(api[1]),
        "KUBERNETES_PORT": f"tcp://{api[0]}:{api[1]}",
    }
    for source in spec.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, ref in (
            ("secrets", source.get("secretRef")),
            ("configmaps", source.get("configMapRef")),
        ):
            if ref:
                data = _data(store, run, kind, ref["name"], bool(ref.get("optional")))
                env.update({prefix + k: v for k, v in data.items()})
    for var in spec.get("env") or []:
        if "valueFrom" not in var:
            env[var["name"]] = expand(var.get("value", ""), env)
            continue
        value = _value_from(store, run, var["valueFrom"])
        if value is not None:
            env[var["name"]] = value
    return env


def _value_from(store: Store, run: PodRun, source: Obj) -> str | None:
    for kind, key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
        if key in source:
            ref = source[key]
            data = _data(store, run, kind, ref["name"], bool(ref.get("optional")))
            if ref["key"] not in data:
                if ref.get("optional"):
                    return None
                what = "Secret" if kind == "secrets" else "ConfigMap"
                raise ConfigError(
                    f"couldn't find key {ref['key']} in {what} {run.namespace}/{ref['name']}"
                )
            return data[ref["key"]]
    path = source.get("fieldRef", {}).get("fieldPath", "")
    pod = store.get("pods", run.namespace, run.name) or {}
    values = {
        "metadata.name": run.name,
        "metadata.namespace": run.namespace,
        "metadata.uid": run.uid,
        "spec.nodeName": run.node,
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", "default"),
        "status.podIP": run.ip,
        "status.hostIP": run.host_ip,
    }
    return str(values.get(path, ""))


def _data(store: Store, run: PodRun, kind: str, name: str, optional: bool) -> dict[str, str]:
    obj = store.get(kind, run.namespace, name)
    if obj is None:
        if optional:
            return {}
        raise ConfigError(f'{kind[:-1]} "{name}" not found')
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    return dict(obj.get("data") or {})


def working_dir(run: PodRun, spec: Obj) -> Path:
    return Path(spec["workingDir"]) if spec.get("workingDir") else run.folder


def pod_status(run: PodRun, old: Obj) -> Obj:
    """The pod's status as its kubelet reports it now (`old`: the status stored)."""
    statuses, unready, phase_votes = [], [], []
    for c in run.containers.values():
        state, last = c.state()
        running = "running" in state
        if not running:
            unready.append(c.name)
        current = c.current
        statuses.append(
            {
                "name": c.name,
                "image": c.spec.get("image", ""),
                "imageID": f"standin://{c.spec.get('image', '')}" if current else "",
                **(
                    {"containerID": f"standin://{current.proc.pid}"}
                    if current and current.proc
                    else {}
                ),
                "ready": running,
                "started": running,
                "restartCount": max(len(c.instances) - 1, 0),
                "state": state,
                "lastState": last,
            }
        )
        if "waiting" in state and not c.instances:
            phase_votes.append("Pending")
        elif c.finished and current is not None and current.terminated is not None:
            phase_votes.append("Succeeded" if current.terminated["exitCode"] == 0 else "Failed")
        else:
            phase_votes.append("Running")
    if "Pending" in phase_votes:
        phase = "Pending"
    elif "Running" in phase_votes:
        phase = "Running"
    else:
        phase = "Failed" if "Failed" in phase_votes else "Succeeded"
    stamp = now()
    kept = {c["type"]: c for c in old.get("conditions", [])}

    def condition(type_: str, ok: bool, reason: str = "", message: str = "") -> Obj:
        was = kept.get(type_)
        status = "True" if ok else "False"
        since = was["lastTransitionTime"] if was and was["status"] == status else stamp
        extra = {"reason": reason, "message": message} if reason and not ok else {}
        return {
            "type": type_,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": since,
            **extra,
        }

    reason = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
    message = (
        f"containers with unready status: [{' '.join(unready)}]"
        if reason == "ContainersNotReady"
        else ""
    )
    conditions = [
        condition("PodReadyToStartContainers", True),
        condition("Initialized", True),
        condition("Ready", not unready, reason, message),
        condition("ContainersReady", not unready, reason, message),
        kept.get("PodScheduled") or condition("PodScheduled", True),
        *(c for t, c in kept.items() if t == "DisruptionTarget"),
    ]
    return {
        **{k: v for k, v in old.items() if k in ("reason", "message", "qosClass")},
        "phase": phase,
        "conditions": conditions,
        "hostIP": run.host_ip,
        "hostIPs": [{"ip": run.host_ip}],
        "podIP": run.ip,
        "podIPs": [{"ip": run.ip}],
        "startTime": old.get("startTime") or stamp,
        "containerStatuses": statuses,
    }


def expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` → its value where defined; ``$$`` → ``$`` (the kubelet's expansion)."""

    def one(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        return env.get(m[1], m[0])

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def why(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "executable file not found in $PATH"
    return exc.strerror or str(exc)


def members(sessions: set[int]) -> list[int]:
    """Live processes whose session is one of `sessions` (read from /proc; Linux)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z" and int(fields[3]) in sessions:
            out.append(int(entry))
    return out


def log_readers(proc: subprocess.Popen[bytes], instance: Instance) -> None:
    """Threads copying the process's stdout and stderr into its CRI-style log."""
    lock = threading.Lock()
    sink = instance.log.open("ab")
    left = [2]

    def read(stream: BinaryIO, name: str) -> None:
        pending = b""
        while chunk := os.read(stream.fileno(), 65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            parts = [(line, b"F") for line in lines]
            while len(pending) > _LINE:
                parts.append((pending[:_LINE], b"P"))
                pending = pending[_LINE:]
            write_log(sink, lock, name, parts)
        if pending:
            write_log(sink, lock, name, [(pending, b"P")])
        stream.close()
        with lock:
            left[0] -= 1
            if not left[0]:
                sink.close()
                instance.done.set()

    for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        assert stream is not None
        threading.Thread(target=read, args=(stream, name), daemon=True).start()


def write_log(
    sink: BinaryIO, lock: threading.Lock, stream: str, parts: list[tuple[bytes, bytes]]
) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
    with lock:
        for content, tag in parts:
            sink.write(b"%s %s %s %s\n" % (stamp, stream.encode(), tag, content))
        sink.flush()


def read_log(instance: Instance, offset: int = 0) -> tuple[list[tuple[bytes, bytes]], int]:
    """The log's complete lines from byte `offset` on, as (timestamp, text with its newline
    when the line was whole), and the offset after them."""
    try:
        with instance.log.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].split(b"\n")[:-1]:
        stamp, _, rest = line.partition(b" ")
        _, _, rest = rest.partition(b" ")
        tag, _, content = rest.partition(b" ")
        out.append((stamp, content + (b"\n" if tag == b"F" else b"")))
    return out, offset + end


def follow(
    instance: Instance, offset: int, stop: threading.Event
) -> Iterator[list[tuple[bytes, bytes]]]:
    """The log's lines as they come, until the instance's output ends (or `stop`)."""
    while True:
        finished = instance.done.is_set()
        lines, offset = read_log(instance, offset)
        if lines:
            yield lines
        if finished or stop.is_set() or not instance.log.exists():
            return
        time.sleep(0.05)
