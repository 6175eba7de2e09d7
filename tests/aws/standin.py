"""A local stand-in for AWS: moto's server app behind a small WSGI middleware, on 127.0.0.1.

``StandIn`` serves moto's ``DomainDispatcherApplication`` (every service moto has: EC2, SSM, STS…;
moto picks the backend from the service in the SigV4 ``Authorization`` header) from a threaded
werkzeug server in the test process, so a test can change the rules while a CLI subprocess talks
to it over HTTP. ``StandInApp``, the middleware, fills moto's gaps and watches the traffic:

- **records** every signed request as a ``Call`` (service, action, flat params, region);
- **injects faults** from ``add_fault`` rules, answering the error document botocore parses into
  ``ClientError`` with that code, and from ``add_raw_fault`` rules, answering what no AWS service
  sends — a proxy's HTML page, a body cut short, a connection closed unanswered (`Raw`);
- **serves placement groups** (``placement_groups.py``), refusing a ``RunInstances`` into an
  unknown group and a ``DeletePlacementGroup`` while a launched instance is not terminated, and
  writing the group back into moto's instances (moto drops it);
- **honours ``ClientToken``** on ``RunInstances``: moto launches again on a repeated token; EC2
  (and this stand-in) answers the first launch again, or ``IdempotentParameterMismatch`` when the
  other parameters differ. botocore fills in a token when the caller gives none, and a retry
  resends the same one;
- gives **no public IPv4 to multi-interface launches** (EFA on p4d/p4de), as EC2 does;
- **answers Service Quotas' ``GetServiceQuota`` for EC2** (moto knows only VPC's quotas): the
  P-instance vCPU quotas ``EC2_QUOTAS`` at their defaults, or what ``set_service_quota`` set
  for a region; any other EC2 quota code is ``NoSuchResourceException``, as AWS answers a code
  it does not know;
- on start and ``reset``, re-applies the offering and instance-type shims of ``moto_gaps.py``,
  and its indexed tag lookup (``index_tag_lookups``: moto scans every tag of the region to find
  one resource's, which made a describe of N tagged instances cost O(N²)).

Faults and retries: botocore retries HTTP 500/502/503/504 and throttling codes
(``RequestLimitExceeded``, ``Throttling``…) — up to 3 attempts in ``standard`` mode, 5 in
``legacy`` — and every attempt reaches the stand-in, is recorded, and uses up one of a rule's
``times``. A ``times=1`` fault with status 500 is therefore hidden by the retry. Use
``AWS_MAX_ATTEMPTS=1`` (``env()`` and the ``aws`` fixture set it) or
``Config(retries={"total_max_attempts": 1})``. ``AWS_MAX_ATTEMPTS`` still applies to a client
whose ``Config(retries=...)`` sets only ``mode``; one that sets ``max_attempts`` or
``total_max_attempts`` overrides it. A 4xx with a non-throttling code is never retried.

Only dummy credentials reach it; moto maps them to its default account ``123456789012``.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment
from xml.sax.saxutils import escape

import boto3
from botocore.config import Config
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.test import Client

from tests.aws import moto_gaps
from tests.aws.ec2_query import Ec2Error, error_xml, indexed, listed, request_id
from tests.aws.leftovers import CLUSTER_TAG, assert_empty, leftovers
from tests.aws.moto_gaps import (
    DLAMI_NAME,
    DLAMI_NAME_PATTERN,
    DLAMI_OWNER_ID,
    DLAMI_SSM_PARAMETER,
    GPU_TYPES,
    GPU_ZONES,
    put_dlami_parameter,
    register_dlami,
)
from tests.aws.placement_groups import ACTIONS as PLACEMENT_ACTIONS
from tests.aws.placement_groups import PlacementGroup, PlacementGroups

__all__ = [
    "CLUSTER_TAG",
    "DLAMI_NAME",
    "DLAMI_NAME_PATTERN",
    "DLAMI_OWNER_ID",
    "DLAMI_SSM_PARAMETER",
    "EC2_QUOTAS",
    "GPU_TYPES",
    "GPU_ZONES",
    "Call",
    "Ec2Error",
    "Fault",
    "PlacementGroup",
    "Raw",
    "StandIn",
    "StandInApp",
    "assert_empty",
    "leftovers",
    "put_dlami_parameter",
    "register_dlami",
]

EC2_QUOTAS = {
    "L-417A185B": ("Running On-Demand P instances", 384.0),
    "L-7212CCBC": ("All P Spot Instance Requests", 192.0),
}
"""EC2 quota code → (name, default vCPUs) that the stand-in's Service Quotas answers: room for
four p4d.24xlarge on demand and two as spot (a new AWS account often starts at 0)."""

_SCOPE = re.compile(r"Credential=[^/]+/\d+/([^/]+)/([^/]+)/aws4_request")
_INSTANCE_ID = re.compile(rb"<instanceId>(i-[0-9a-f]+)</instanceId>")


@dataclass(frozen=True)
class Call:
    """One signed request as the stand-in received it.

    ``params`` is flat: query-protocol services (EC2, STS) as sent, e.g.
    ``{"Placement.GroupName": "pg", "NetworkInterface.1.InterfaceType": "efa"}`` (without
    ``Action`` and ``Version``); JSON services (SSM) as the top-level members, non-strings as JSON.
    """

    service: str
    action: str
    params: dict[str, str]
    region: str
    protocol: str = "query"

    def indexed(self, prefix: str) -> list[dict[str, str]]:
        """``call.indexed("NetworkInterface")`` → ``[{"InterfaceType": "efa", ...}, ...]``."""
        return indexed(self.params, prefix)

    def listed(self, prefix: str) -> list[str]:
        """``call.listed("InstanceId")`` → ``["i-1", "i-2"]``."""
        return listed(self.params, prefix)

    @property
    def zone(self) -> str | None:
        """The zone a request names: ``Placement.AvailabilityZone`` or ``AvailabilityZone``."""
        return self.params.get("Placement.AvailabilityZone") or self.params.get("AvailabilityZone")

    @property
    def subnet_ids(self) -> list[str]:
        """``SubnetId`` and every ``NetworkInterface.N.SubnetId``."""
        found = [self.params["SubnetId"]] if "SubnetId" in self.params else []
        return found + [n["SubnetId"] for n in self.indexed("NetworkInterface") if "SubnetId" in n]


@dataclass
class Fault:
    """A rule: answer matching requests with an error instead of passing them to moto.

    Matches ``service`` and ``action``; ``region`` if set; ``zone`` if set — the zone the request
    names in ``Placement.AvailabilityZone``/``AvailabilityZone``, or else the zone moto holds for
    its ``SubnetId``/``NetworkInterface.N.SubnetId`` (a request naming no zone matches no zone
    rule); and ``when(call)`` if given. ``times`` is how many more requests it answers (None:
    all); ``hits`` counts those it has answered.
    """

    action: str
    code: str
    message: str
    status: int = 500
    zone: str | None = None
    region: str | None = None
    times: int | None = None
    when: Callable[[Call], bool] | None = None
    service: str = "ec2"
    hits: int = 0
    raw: Raw | None = None

    def matches(self, call: Call) -> bool:
        if (self.service, self.action) != (call.service, call.action):
            return False
        if self.region is not None and self.region != call.region:
            return False
        if self.zone is not None and self.zone not in _zones(call):
            return False
        return self.when is None or self.when(call)


@dataclass(frozen=True)
class Raw:
    """What a `Fault` made by ``add_raw_fault`` answers instead of an AWS error document.

    ``body`` with ``status`` as sent; ``length``, when set, is the ``Content-Length`` claimed
    (more than ``body`` to cut it short: the connection closes after ``body``); ``drop`` closes
    the connection without answering at all."""

    status: int = 502
    body: bytes = b""
    content_type: str = "text/html"
    length: int | None = None
    drop: bool = False


def _zones(call: Call) -> set[str]:
    if call.zone:
        return {call.zone}
    zones = (moto_gaps.subnet_zone(call.region, s) for s in call.subnet_ids)
    return {z for z in zones if z}


@dataclass(frozen=True)
class _Answer:
    status: str
    headers: list[tuple[str, str]]
    body: bytes


def _answer(status: int, body: bytes, content_type: str = "text/xml") -> _Answer:
    return _Answer(
        f"{status} {HTTPStatus(status).phrase}",
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("x-amzn-RequestId", request_id()),
        ],
        body,
    )


def _error(call: Call, code: str, message: str, status: int) -> _Answer:
    """The error document of ``call``'s protocol: EC2 XML, JSON (SSM), or query XML (STS)."""
    if call.service == "ec2":
        return _answer(status, error_xml(code, message))
    if call.protocol == "json":
        body = json.dumps({"__type": code, "message": message}).encode()
        return _answer(status, body, "application/x-amz-json-1.1")
    kind = "Receiver" if status >= 500 else "Sender"
    body = (
        f"<ErrorResponse><Error><Type>{kind}</Type><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error><RequestId>{request_id()}</RequestId>"
        "</ErrorResponse>"
    ).encode()
    return _answer(status, body)


class StandInApp:
    """The WSGI middleware in front of moto: records, injects faults, fills moto's gaps."""

    def __init__(self, inner: WSGIApplication | None = None) -> None:
        self.inner: WSGIApplication = inner or DomainDispatcherApplication(create_backend_app)
        self.placement_groups = PlacementGroups(is_live=self._is_live)
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._faults: list[Fault] = []
        self._launches: dict[tuple[str, str], tuple[dict[str, str], bytes]] = {}
        #: (region, EC2 quota code) → the value set by ``set_service_quota``
        self._service_quotas: dict[tuple[str, str], float] = {}
        moto_gaps.extend_gpu_offerings()
        moto_gaps.add_p3_instance_types()
        moto_gaps.index_tag_lookups()

    # -- the test-facing API -------------------------------------------------------------------

    def calls(
        self, action: str | None = None, region: str | None = None, service: str | None = "ec2"
    ) -> list[Call]:
        """The recorded requests of ``service`` (None: all), oldest first; filtered by action
        and region if given."""
        with self._lock:
            return [
                c
                for c in self._calls
                if (service is None or c.service == service)
                and (action is None or c.action == action)
                and (region is None or c.region == region)
            ]

    def count_by_action(self, service: str = "ec2") -> dict[str, int]:
        """How many requests of ``service`` each action received, e.g. ``{"RunInstances": 2}``."""
        return dict(Counter(c.action for c in self.calls(service=service)))

    def add_fault(
        self,
        action: str,
        code: str,
        message: str = "Injected by the AWS stand-in.",
        status: int = 500,
        *,
        zone: str | None = None,
        region: str | None = None,
        times: int | None = None,
        when: Callable[[Call], bool] | None = None,
        service: str = "ec2",
    ) -> Fault:
        """Adds a ``Fault`` rule (see there); the first matching rule answers. Returns it."""
        fault = Fault(action, code, message, status, zone, region, times, when, service)
        with self._lock:
            self._faults.append(fault)
        return fault

    def add_raw_fault(
        self,
        action: str,
        raw: Raw,
        *,
        zone: str | None = None,
        region: str | None = None,
        times: int | None = None,
        when: Callable[[Call], bool] | None = None,
        service: str = "ec2",
    ) -> Fault:
        """Adds a ``Fault`` rule that answers `raw` (see `Raw`) to matching requests."""
        fault = Fault(action, "", "", raw.status, zone, region, times, when, service, raw=raw)
        with self._lock:
            self._faults.append(fault)
        return fault

    def set_service_quota(self, code: str, value: float, region: str = "us-east-1") -> None:
        """What ``GetServiceQuota`` answers for EC2 quota `code` in `region` (one of
        ``EC2_QUOTAS``) until the next ``reset``."""
        if code not in EC2_QUOTAS:
            raise ValueError(f"the stand-in serves the EC2 quotas {sorted(EC2_QUOTAS)} only")
        with self._lock:
            self._service_quotas[(region, code)] = value

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def reset(self) -> None:
        """Empties moto and forgets placement groups, calls, faults and client tokens."""
        Client(self.inner).post("/moto-api/reset").close()
        self.placement_groups.clear()
        with self._lock:
            self._calls.clear()
            self._faults.clear()
            self._launches.clear()
            self._service_quotas.clear()
        moto_gaps.extend_gpu_offerings()
        moto_gaps.add_p3_instance_types()
        moto_gaps.index_tag_lookups()

    # -- WSGI ----------------------------------------------------------------------------------

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        call = self._parse(environ)
        if call is None:  # unsigned: moto's own API (/moto-api/reset) and the like
            return self.inner(environ, start_response)
        with self._lock:
            self._calls.append(call)
        if self._drop(call, environ):
            raise ConnectionResetError("the AWS stand-in closed the connection unanswered")
        try:
            answer = self._answer(call, environ)
        except Ec2Error as e:
            answer = _error(call, e.code, e.message, e.status)
        if answer is None:
            return self.inner(environ, start_response)
        start_response(answer.status, answer.headers)
        return [answer.body]

    def _parse(self, environ: WSGIEnvironment) -> Call | None:
        scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
        if scope is None:
            return None
        region, service = scope.groups()
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        target = environ.get("HTTP_X_AMZ_TARGET")
        if target:
            loaded = json.loads(body or b"{}")
            params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in loaded.items()}
            return Call(service, target.rpartition(".")[2], params, region, "json")
        pairs = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        pairs += parse_qsl(body.decode(), keep_blank_values=True)
        params = dict(pairs)
        action = params.pop("Action", "")
        params.pop("Version", None)
        return Call(service, action, params, region)

    def _answer(self, call: Call, environ: WSGIEnvironment) -> _Answer | None:
        """The stand-in's own answer to ``call``, or None to let moto answer it."""
        fault = self._fault_for(call)
        if fault is not None and fault.raw is not None:
            return _raw_answer(fault.raw)
        if fault is not None:
            return _error(call, fault.code, fault.message, fault.status)
        if call.service == "servicequotas" and call.action == "GetServiceQuota":
            return self._service_quota(call)
        if call.service != "ec2":
            return None
        if call.action in PLACEMENT_ACTIONS:
            body = self.placement_groups.handle(
                call.action, call.params, call.region, DEFAULT_ACCOUNT_ID
            )
            return _answer(200, body)
        if call.action == "RunInstances":
            return self._run_instances(call, environ)
        return None

    def _service_quota(self, call: Call) -> _Answer | None:
        """An EC2 quota as Service Quotas writes it; None (moto answers) for other services."""
        if call.params.get("ServiceCode") != "ec2":
            return None
        code = call.params.get("QuotaCode", "")
        if code not in EC2_QUOTAS:
            raise Ec2Error(
                "NoSuchResourceException",
                f"The request failed because the specified quota {code} does not exist.",
                400,
            )
        name, default = EC2_QUOTAS[code]
        with self._lock:
            value = self._service_quotas.get((call.region, code), default)
        quota = {
            "ServiceCode": "ec2",
            "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:{call.region}:{DEFAULT_ACCOUNT_ID}:ec2/{code}",
            "QuotaCode": code,
            "QuotaName": name,
            "Value": value,
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
            "QuotaAppliedAtLevel": "ACCOUNT",
        }
        body = json.dumps({"Quota": quota}).encode()
        return _answer(200, body, "application/x-amz-json-1.1")

    def _drop(self, call: Call, environ: WSGIEnvironment) -> bool:
        """Whether the first matching rule is a `Raw` ``drop``; if so, the request's socket is
        shut down (werkzeug then treats the connection as dropped by the client)."""
        with self._lock:
            first = next((f for f in self._faults if _live(f) and f.matches(call)), None)
        if first is None or first.raw is None or not first.raw.drop:
            return False
        self._fault_for(call)  # counts the hit and uses up one of its `times`
        environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
        return True

    def _fault_for(self, call: Call) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if (fault.times is None or fault.times > 0) and fault.matches(call):
                    fault.hits += 1
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    def _run_instances(self, call: Call, environ: WSGIEnvironment) -> _Answer:
        group = self.placement_groups.for_launch(call.params, call.region)
        token = (call.region, call.params.get("ClientToken", ""))
        with self._lock:
            earlier = self._launches.get(token) if token[1] else None
        if earlier is not None:
            if earlier[0] != call.params:
                raise Ec2Error(
                    "IdempotentParameterMismatch",
                    "Arguments on this idempotent request are inconsistent with arguments used "
                    "in previous request(s).",
                )
            return _answer(200, earlier[1])
        answer = self._inner_answer(environ)
        if not answer.status.startswith("200"):
            return answer
        instance_ids = [m.decode() for m in _INSTANCE_ID.findall(answer.body)]
        if group is not None:
            self.placement_groups.launched(group, instance_ids)
            moto_gaps.set_instance_placement(call.region, instance_ids, group.name, group.group_id)
        if len(call.indexed("NetworkInterface")) > 1:
            moto_gaps.drop_public_ips(call.region, instance_ids)
        if token[1]:
            with self._lock:
                self._launches[token] = (call.params, answer.body)
        return answer

    def _inner_answer(self, environ: WSGIEnvironment) -> _Answer:
        """moto's answer, read whole so the stand-in can look into it."""
        started: list[Any] = []

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            started[:] = [status, headers]
            return lambda data: None

        result = self.inner(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return _Answer(started[0], started[1], body)

    def _is_live(self, region: str, instance_id: str) -> bool:
        return moto_gaps.instance_state(region, instance_id) not in (None, "terminated")


def _live(fault: Fault) -> bool:
    return fault.times is None or fault.times > 0


def _raw_answer(raw: Raw) -> _Answer:
    """`raw` as an answer: its body, and the length it claims (`Raw.length`)."""
    answer = _answer(raw.status, raw.body, raw.content_type)
    if raw.length is None:
        return answer
    headers = [(k, str(raw.length) if k == "Content-Length" else v) for k, v in answer.headers]
    return _Answer(answer.status, headers, raw.body)


class _QuietHandler(MotoRequestHandler):
    """moto's request handler without werkzeug's access line per request."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class StandIn:
    """The stand-in server: ``StandInApp`` on ``127.0.0.1`` at a free port, in a thread."""

    def __init__(self, app: StandInApp | None = None) -> None:
        self.app = app or StandInApp()
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._session = boto3.session.Session()
        self._session_lock = threading.Lock()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the AWS stand-in is not started")
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> StandIn:
        server = make_server("127.0.0.1", 0, self.app, threaded=True, request_handler=_QuietHandler)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="aws-standin",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        self.app.reset()

    def env(self, region: str = "us-east-1") -> dict[str, str | None]:
        """What a process needs to reach only the stand-in; ``None`` means unset it.

        The config and credentials files are pointed at an empty file, so a developer's
        ``~/.aws`` (profiles, ``ignore_configured_endpoint_urls``, retry settings) cannot steer a
        client to real AWS.
        """
        return {
            # moto's instance addresses (54.x) belong to strangers: no SSH leaves loopback
            "CLOUDTRAIN_SSH_LOOPBACK_ONLY": "1",
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": region,
            "AWS_REGION": region,
            "AWS_MAX_ATTEMPTS": "1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_PROFILE": None,
            "AWS_DEFAULT_PROFILE": None,
            "AWS_SESSION_TOKEN": None,
            "AWS_SECURITY_TOKEN": None,
            "AWS_ROLE_ARN": None,
            "AWS_WEB_IDENTITY_TOKEN_FILE": None,
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": None,
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": None,
            "AWS_RETRY_MODE": None,
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": None,
        }

    def subprocess_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with ``env()`` applied: for ``subprocess.run``."""
        merged = dict(os.environ if base is None else base)
        for key, value in self.env().items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return merged

    def client(self, service: str, region: str = "us-east-1") -> Any:
        """A new boto3 client of ``service`` that talks to the stand-in only, with no retries.

        Clients share one boto3 session, so that each is quick to make (the service model is
        loaded once); each has its own event hooks.
        """
        with self._session_lock:
            return self._session.client(
                service,
                region_name=region,
                endpoint_url=self.url,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
            )
