"""The stand-in's kubelet: a bound pod's containers run as real process trees on this machine.

Each pod gets a folder of its own (`Kubelet.pod_dir`: its containers' cwd unless they set
``workingDir``, and their ``HOME``); each container is its ``command`` + ``args`` (``$(VAR)``
expanded as the kubelet does) started in a session of its own, so that the whole tree can be
signalled, with an environment built from a small base (``PATH`` led by the directory of this
test's ``python``, ``LANG``), ``HOSTNAME``, ``KUBERNETES_SERVICE_HOST/PORT`` (this stand-in),
``envFrom`` and ``env`` (``value``; ``valueFrom`` secretKeyRef, configMapKeyRef, fieldRef).

A container's lifecycle, as its status shows it::

    waiting ContainerCreating ──► running ──► terminated (Completed / Error, exitCode)
       │  ErrImagePull ⇄ ImagePullBackOff       │ restartPolicy Always, or OnFailure and ≠ 0
       │  CreateContainerConfigError            ▼
       └────────────── (retried) ◄────── waiting CrashLoopBackOff (lastState, restartCount)

When the main process exits the rest of its session is killed (a container's cgroup dies
with its PID 1). stdout and stderr are read by threads into a CRI-style log file per
container instance (the one before a restart is kept for ``previous``). Back-off starts at
``backoff[0]`` seconds and doubles up to ``backoff[1]``: short, so tests run fast.

An exec (`spawn`) runs in a session of its own with its container's environment and cwd; it
may start while the container's main process runs (a terminating pod's too, until the grace
period ends), and it and whatever it left running die with that process, as in the
container's PID namespace: every process the kubelet starts joins its container's cgroup
first (`cgroups`), so one that left its session (``setsid``) is found and killed too. A pod
is reported stopped only once none of its processes lives.

Departures: the image is never pulled nor used (only `fail_image` looks at it); no volumes,
probes, init containers or resource limits; SIGTERM goes to each container's whole process
group (a runtime sends it to PID 1 only); pods share the host's filesystem and network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.k8s.cgroups import Groups
from tests.k8s.containers import (
    ConfigError,
    Container,
    Instance,
    PodRun,
    environment,
    expand,
    log_readers,
    members,
    pod_status,
    why,
    working_dir,
)
from tests.k8s.store import Obj, Store, bad_request, now, record


class Kubelet:
    """Every node's kubelet at once (nodes differ only in name here)."""

    def __init__(
        self,
        store: Store,
        root: Path,
        api: tuple[str, int],
        backoff: tuple[float, float],
        changed: Callable[[], None],
    ) -> None:
        self.store, self.root, self.api, self.backoff = store, root, api, backoff
        self.changed = changed  # a pod ended: capacity came free
        self.pods: dict[tuple[str, str], PodRun] = {}
        self.failed_images: set[str] = set()
        self.sessions: set[int] = set()  # every process group it started
        self.groups = Groups(root.name)  # every process of a container, in any session
        self.lock = threading.Lock()

    # -- start -------------------------------------------------------------------------------

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.root / "pods" / namespace / name

    def start(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        key = (meta["namespace"], meta["name"])
        run = PodRun(
            key[0],
            key[1],
            meta["uid"],
            spec["nodeName"],
            pod["status"]["podIP"],
            pod["status"]["hostIP"],
            self.pod_dir(*key),
            self.root / "logs" / f"{key[0]}_{key[1]}_{meta['uid']}",
            {c["name"]: Container(c) for c in spec["containers"]},
            spec.get("restartPolicy", "Always"),
        )
        run.folder.mkdir(parents=True, exist_ok=True)
        run.logs.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self.pods[key] = run
        self.publish(run)
        for container in run.containers.values():
            container.thread = threading.Thread(
                target=self._supervise, args=(run, container), daemon=True
            )
            container.thread.start()

    def _supervise(self, run: PodRun, c: Container) -> None:
        """One container's life: configure, start, wait, restart after a back-off."""
        delay, pulled = self.backoff[0], False
        while not run.stop.is_set():
            image = c.spec.get("image", "")
            if image in self.failed_images:
                self._image_failure(run, c, image, delay)
                delay = min(delay * 2, self.backoff[1])
                continue
            try:
                c.env, c.cwd = (
                    environment(self.store, self.api, run, c.spec),
                    working_dir(run, c.spec),
                )
            except ConfigError as exc:
                c.waiting = ("CreateContainerConfigError", str(exc))
                self.publish(run)
                self._event(run, c, "Warning", "Failed", f"Error: {exc}")
                run.stop.wait(delay)
                continue
            if not pulled:
                self._event(
                    run,
                    c,
                    "Normal",
                    "Pulled",
                    f'Container image "{image}" already present on machine',
                )
                pulled = True
            instance = self._launch(run, c)
            if instance is None:
                break
            if instance.proc is not None:
                code = instance.proc.wait()
                self._kill(instance.proc.pid, signal.SIGKILL)
                with run.lock:  # its execs die with it, as in the container's PID namespace
                    execs = {s for s, name in run.execs.items() if name == c.name}
                self._kill_dead(execs, f"{run.namespace}/{run.name}/{c.name}")
                instance.done.wait(5)  # a daemon that left the session may hold the pipes
                self._terminated(instance, code)
            restart = self.restarts(run, instance)
            c.finished = not restart
            if not restart:
                self.publish(run)
                break
            assert instance.terminated is not None
            back_off = f"{int(delay * 1000)}ms" if delay < 1 else f"{delay:g}s"
            pod_ref = f"{run.name}_{run.namespace}({run.uid})"
            c.waiting = (
                "CrashLoopBackOff",
                f"back-off {back_off} restarting failed container={c.name} pod={pod_ref}",
            )
            self.publish(run)
            self._event(
                run,
                c,
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {c.name} in pod {pod_ref}",
            )
            run.stop.wait(delay)
            delay = min(delay * 2, self.backoff[1])
        self.changed()

    def restarts(self, run: PodRun, instance: Instance) -> bool:
        code = (instance.terminated or {}).get("exitCode", 1)
        if run.stop.is_set() or run.restart == "Never":
            return False
        return run.restart == "Always" or code != 0

    def _image_failure(self, run: PodRun, c: Container, image: str, delay: float) -> None:
        cause = (
            f'failed to pull and unpack image "{image}": failed to resolve reference '
            f'"{image}": {image}: not found'
        )
        c.waiting = ("ErrImagePull", f"rpc error: code = NotFound desc = {cause}")
        self.publish(run)
        self._event(run, c, "Normal", "Pulling", f'Pulling image "{image}"')
        self._event(
            run,
            c,
            "Warning",
            "Failed",
            f'Failed to pull image "{image}": rpc error: code = NotFound desc = {cause}',
        )
        self._event(run, c, "Warning", "Failed", "Error: ErrImagePull")
        if run.stop.wait(delay / 2):
            return
        c.waiting = ("ImagePullBackOff", f'Back-off pulling image "{image}"')
        self.publish(run)
        self._event(run, c, "Normal", "BackOff", f'Back-off pulling image "{image}"')
        self._event(run, c, "Warning", "Failed", "Error: ImagePullBackOff")
        run.stop.wait(delay)

    def _launch(self, run: PodRun, c: Container) -> Instance | None:
        argv = [expand(a, c.env) for a in [*c.spec.get("command", []), *c.spec.get("args", [])]]
        argv = argv or ["sleep", "infinity"]  # no command: the image's entrypoint is unknown here
        number = len(c.instances)
        instance = Instance(number, run.logs / f"{c.name}.{number}.log")
        with run.lock:
            if run.stop.is_set():
                return None
            if c.instances:  # only the previous instance's log is kept
                old = run.logs / f"{c.name}.{number - 2}.log"
                old.unlink(missing_ok=True)
            instance.started = now()
            join, joined = self.groups.preexec(f"{run.namespace}/{run.name}/{c.name}")
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=c.cwd,
                    env=c.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=join,
                )
            except OSError as exc:
                joined()
                instance.log.touch()
                instance.done.set()
                c.instances.append(instance)
                c.waiting = None
                instance.terminated = {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": "failed to create containerd task: failed to create shim task: OCI "
                    "runtime create failed: runc create failed: unable to start container "
                    f'process: exec: "{argv[0]}": {why(exc)}: unknown',
                    "startedAt": "1970-01-01T00:00:00Z",
                    "finishedAt": now(),
                    "containerID": "standin://failed",
                }
                self._event(run, c, "Warning", "Failed", f"Error: {instance.terminated['message']}")
                return instance
            joined()
            instance.proc = proc
            with self.lock:
                self.sessions.add(proc.pid)
            c.instances.append(instance)
            c.waiting = None
        log_readers(proc, instance)
        self.publish(run)
        if number == 0:
            self._event(run, c, "Normal", "Created", f"Created container {c.name}")
        self._event(run, c, "Normal", "Started", f"Started container {c.name}")
        return instance

    def _terminated(self, instance: Instance, code: int) -> None:
        if code < 0:
            code = 128 - code  # killed by a signal: a runtime reports 128 + signal
        assert instance.proc is not None
        instance.terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": instance.started,
            "finishedAt": now(),
            "containerID": f"standin://{instance.proc.pid}",
        }

    # -- status --------------------------------------------------------------------------------

    def publish(self, run: PodRun) -> None:
        """Writes the pod's status as the kubelet sees it now (one MODIFIED if it changed)."""
        with self.store.lock:
            pod = self.store.get("pods", run.namespace, run.name)
            if run.silent or pod is None or pod["metadata"]["uid"] != run.uid:
                return
            status = pod_status(run, pod["status"])
            self.store.update(
                "pods", run.namespace, run.name, lambda p: p.__setitem__("status", status)
            )

    def _event(self, run: PodRun, c: Container, type_: str, reason: str, message: str) -> None:
        pod = self.store.get("pods", run.namespace, run.name)
        if pod is not None and pod["metadata"]["uid"] == run.uid:
            record(
                self.store,
                pod,
                type_,
                reason,
                message,
                "kubelet",
                run.node,
                f"spec.containers{{{c.name}}}",
            )

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, namespace: str, name: str, grace: float, publish: bool = True) -> None:
        """Stops a pod: SIGTERM to each container's process group, SIGKILL to what is left
        after `grace` seconds, execs included (they may run until then, as in a container
        that is terminating); then its folder and logs are removed. Blocks. Without
        `publish` the pod's status is left as it was (a lost node reports nothing)."""
        with self.lock:
            run = self.pods.get((namespace, name))
        if run is None:
            return
        with run.lock:
            run.stop.set()
            run.silent = not publish
            procs = [i.proc for c in run.containers.values() for i in c.instances if i.proc]
        live = [p for p in procs if p.poll() is None]
        for proc in live:
            if grace > 0:
                self._event_by_proc(run, proc)
            self._kill(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0))
        with run.lock:
            run.dead = True
            sessions = {p.pid for p in procs} | set(run.execs)
        self._kill_dead(sessions, f"{namespace}/{name}/")
        for c in run.containers.values():
            if c.thread is not None:
                c.thread.join(10)
        for c in run.containers.values():
            c.finished = True
        if publish:
            self.publish(run)
        with self.lock:
            self.pods.pop((namespace, name), None)
        shutil.rmtree(run.folder, ignore_errors=True)
        shutil.rmtree(run.logs, ignore_errors=True)

    def hurry(self, namespace: str, name: str) -> None:
        """A graceful stop under way ends now: SIGKILL to all the pod's processes."""
        with self.lock:
            run = self.pods.get((namespace, name))
        if run is not None:
            with run.lock:
                procs = [i.proc for c in run.containers.values() for i in c.instances if i.proc]
                sessions = {p.pid for p in procs} | set(run.execs)
            self._kill_dead(sessions, f"{namespace}/{name}/")

    def _event_by_proc(self, run: PodRun, proc: subprocess.Popen[bytes]) -> None:
        for c in run.containers.values():
            if c.current is not None and c.current.proc is proc:
                self._event(run, c, "Normal", "Killing", f"Stopping container {c.name}")

    def _members(self, sessions: set[int]) -> list[int]:
        """The live processes of `sessions` that are this kubelet's. A session is named by its
        leader's PID, which the system gives again once that leader is reaped (a long run
        wraps 32768 PIDs): where the containers' cgroups exist, only processes in them count,
        so a stale session never names someone else's process (a Slurm daemon, another
        pod's exec: seen in CI, killed)."""
        found = members(sessions)
        if self.groups.top is None:
            return found  # no cgroups (not root): sessions are all there is to go by
        ours = set(self.groups.pids())
        return [pid for pid in found if pid in ours]

    def _kill(self, session: int, sig: int) -> None:
        """`sig` to the process group `session` leads and, for SIGKILL, to every process of
        its session (a child may have moved to a process group of its own); with cgroups, to
        the session's processes in them alone (`_members`)."""
        if self.groups.top is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(session, sig)
        if sig == signal.SIGKILL or self.groups.top is not None:
            for pid in self._members({session}):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def _kill_dead(self, sessions: set[int], group: str, timeout: float = 10) -> None:
        """SIGKILL to every process of `sessions` and of the cgroups of `group` (a key's
        prefix: a daemon that left its session too), until none is left alive (a process dies
        a little after the signal: the kubelet reports a container stopped once it is)."""
        self.groups.kill(group, timeout)
        deadline = time.monotonic() + timeout
        while True:
            for session in sessions:
                self._kill(session, signal.SIGKILL)
            if not self._members(sessions) or time.monotonic() > deadline:
                return
            time.sleep(0.02)

    def kill_all(self) -> None:
        with self.lock:
            keys = list(self.pods)
        for key in keys:
            self.stop(*key, grace=0)
        with self.lock:
            sessions = set(self.sessions)
        self._kill_dead(sessions, "")
        with self.lock:  # all dead: their numbers are the system's to give again
            self.sessions -= sessions

    def alive(self) -> list[int]:
        """PIDs of live (not zombie) processes in the sessions this kubelet started, or in its
        containers' cgroups (in any session)."""
        with self.lock:
            sessions = set(self.sessions)
        return sorted(set(self._members(sessions)) | set(self.groups.pids()))

    def pids(self, namespace: str, name: str) -> dict[str, int]:
        """The PID of each running container's main process."""
        with self.lock:
            run = self.pods.get((namespace, name))
        out = {}
        for c in run.containers.values() if run else []:
            if c.current and c.current.proc and c.current.terminated is None:
                out[c.name] = c.current.proc.pid
        return out

    # -- exec and logs -------------------------------------------------------------------------

    def running(self, namespace: str, name: str, container: str) -> tuple[PodRun, Container]:
        """The pod's run and the container, if its process runs (an exec may start)."""
        with self.lock:
            run = self.pods.get((namespace, name))
        c = run.containers.get(container) if run else None
        if run is None or c is None or run.dead or c.waiting or not c.current:
            raise bad_request(f'unable to upgrade connection: container not found ("{container}")')
        if c.current.terminated is not None:
            raise bad_request(f'unable to upgrade connection: container not found ("{container}")')
        return run, c

    def spawn(
        self, namespace: str, name: str, container: str, argv: list[str], tty: bool
    ) -> tuple[PodRun, subprocess.Popen[bytes]]:
        """An exec's process in the container (raises OSError when it cannot start)."""
        run, c = self.running(namespace, name, container)
        with run.lock:
            self.running(namespace, name, container)  # again, now that nothing can change
            join, joined = self.groups.preexec(f"{namespace}/{name}/{container}")
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=c.cwd,
                    env=c.env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT if tty else subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=join,
                )
            finally:
                joined()
            run.execs[proc.pid] = container
            with self.lock:
                self.sessions.add(proc.pid)
        return run, proc

    def instance(
        self, namespace: str, name: str, container: str, previous: bool
    ) -> Instance | None:
        with self.lock:
            run = self.pods.get((namespace, name))
        c = run.containers.get(container) if run else None
        if c is None:
            return None
        if previous:
            done = [i for i in c.instances if i.terminated]
            live = c.current is not None and c.current.terminated is None
            older = (
                done[-1] if done and (live or c.waiting) else (done[-2] if len(done) > 1 else None)
            )
            if older is None:
                raise bad_request(
                    f'previous terminated container "{container}" in pod "{name}" not found'
                )
            return older
        if c.current is None:
            reason = c.waiting[0] if c.waiting else "ContainerCreating"
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                reason = "trying and failing to pull image"
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        return c.current
