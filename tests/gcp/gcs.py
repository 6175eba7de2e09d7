"""The state and rules of the GCS JSON API subset the stand-in of `storage.py` serves (no HTTP
here): the part of ``/storage/v1`` google-cloud-storage speaks, as the API's reference writes
it. Objects are listed by name (a delimiter's prefixes, pages of ``maxResults``); media,
multipart and resumable uploads (308 until the last chunk, each chunk kept to a multiple of
256 KiB, CRC32C and MD5 checked); ranged reads; rewrites done in steps of `REWRITE_STEP` bytes
(as GCS does across locations, or when ``maxBytesRewrittenPerCall`` says so); deletes; and
batches (``multipart/mixed``, each part a request of its own). Every error is the API's JSON
error document.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.parser import BytesParser
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import google_crc32c

from tests.contract.stores import Seen

#: What one rewrite call copies at most.
REWRITE_STEP = 4 << 20
_QUANTUM = 256 << 10  # a resumable upload keeps what it got of a chunk in multiples of this
_LIST = re.compile(r"/storage/v1/b/([^/]+)/o")
_OBJECT = re.compile(r"/storage/v1/b/([^/]+)/o/([^/]+)")
_UPLOAD = re.compile(r"/upload/storage/v1/b/([^/]+)/o")
_REWRITE = re.compile(r"/storage/v1/b/([^/]+)/o/([^/]+)/rewriteTo/b/([^/]+)/o/([^/]+)")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)")
_JSON = {"Content-Type": "application/json; charset=UTF-8"}
_generations = itertools.count(time.time_ns() // 1000)

Reply = tuple[int, dict[str, str], bytes]


def _error(status: int, reason: str, message: str) -> Reply:
    """The JSON API's error document."""
    errors = [{"message": message, "domain": "global", "reason": reason}]
    return status, _JSON, json.dumps({"error": {"code": status, "message": message,
                                                "errors": errors}}).encode()  # fmt: skip


def _json(body: dict[str, Any]) -> Reply:
    return 200, _JSON, json.dumps(body).encode()


def _crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


@dataclass
class Obj:
    data: bytes
    content_type: str
    generation: int = field(default_factory=lambda: next(_generations))
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat()[:23] + "Z")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes
    host: str


class Gcs:
    """The buckets, the uploads and rewrites under way, and every request seen in the bucket's
    terms; `fail` picks the requests answered with GCS's internal error (HTTP 500)."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, Obj]] = {}
        self.uploads: dict[str, dict[str, Any]] = {}
        self.rewrites: dict[str, dict[str, Any]] = {}
        self.seen: list[Seen] = []
        self.fail: Callable[[Seen], bool] | None = None
        self.lock = threading.RLock()

    def reset(self, *buckets: str) -> None:
        """Nothing but the empty `buckets`."""
        with self.lock:
            self.buckets = {name: {} for name in buckets}
            self.uploads.clear()
            self.rewrites.clear()
            self.seen.clear()
            self.fail = None

    # -- the API ------------------------------------------------------------------------------

    def answer(self, req: Request) -> Reply:
        """The reply to one request (a batch's part too), or its failure."""
        with self.lock:
            try:
                seen, reply = self._route(req)
            except ValueError:  # a body that is not what it says
                seen = Seen("other", "", None, req.host)
                reply = lambda: _error(400, "parseError", "Parse Error")  # noqa: E731
            self.seen.append(seen)
            if self.fail is not None and self.fail(seen):
                return _error(500, "backendError", "We encountered an internal error.")
            try:
                return reply()
            except ValueError as exc:
                return _error(400, "invalid", f"Invalid argument: {exc}")

    def _route(self, req: Request) -> tuple[Seen, Callable[[], Reply]]:
        """What `req` is in the bucket's terms, and the call that answers it."""
        path, method = req.path, req.method

        def seen(action: str, key: str = "", source: str | None = None) -> Seen:
            return Seen(action, key, source, req.host)

        if path == "/batch/storage/v1" and method == "POST":
            return seen("other"), lambda: self._batch(req)
        if found := _UPLOAD.fullmatch(path):
            bucket = unquote(found[1])
            if "upload_id" not in req.query:  # the whole object, or a resumable one begun
                begun = req.query.get("uploadType") == "resumable"
                said = self._parts(req)
                return seen("other" if begun else "write", said[0]), lambda: self._upload(
                    req, bucket, *said
                )
            upload = self.uploads.get(req.query["upload_id"])
            if upload is None:
                return seen("other"), lambda: _error(404, "notFound", "No such upload")
            # a chunk of bytes, or the question of how many it has (``bytes */TOTAL``)
            data = not req.headers.get("content-range", "").startswith("bytes */")
            return seen("write" if data else "other", upload["name"]), lambda: self._chunk(
                req, bucket, upload
            )
        if (found := _REWRITE.fullmatch(path)) and method == "POST":
            parts = [unquote(p) for p in found.groups()]
            return seen("copy", parts[3], parts[1]), lambda: self._rewrite(req, *parts)
        if (found := _LIST.fullmatch(path)) and method == "GET":
            return seen("list"), lambda: self._list(req, unquote(found[1]))
        if found := _OBJECT.fullmatch(path.removeprefix("/download")):
            bucket, name = unquote(found[1]), unquote(found[2])
            media = path.startswith("/download") or req.query.get("alt") == "media"
            action = {"GET": "read" if media else "other", "DELETE": "delete"}.get(method)
            return seen(action or "other", name), lambda: self._object(req, bucket, name, media)
        return seen("other"), lambda: _error(404, "notFound", "Not Found")

    def resource(self, host: str, bucket: str, name: str, obj: Obj) -> dict[str, Any]:
        path = f"b/{bucket}/o/{quote(name, safe='')}"
        return {
            "kind": "storage#object", "id": f"{bucket}/{name}/{obj.generation}",
            "selfLink": f"http://{host}/storage/v1/{path}",
            "mediaLink": f"http://{host}/download/storage/v1/{path}?generation="
                         f"{obj.generation}&alt=media",
            "name": name, "bucket": bucket, "generation": str(obj.generation),
            "metageneration": "1", "contentType": obj.content_type, "storageClass": "STANDARD",
            "size": str(len(obj.data)), "md5Hash": _md5(obj.data), "crc32c": _crc32c(obj.data),
            "etag": _md5(obj.data)[:12], "timeCreated": obj.created, "updated": obj.created,
            "timeStorageClassUpdated": obj.created,
        }  # fmt: skip

    def _missing(self, bucket: str, name: str | None = None) -> Reply | None:
        if bucket not in self.buckets:
            return _error(404, "notFound", "The specified bucket does not exist.")
        if name is not None and name not in self.buckets[bucket]:
            return _error(404, "notFound", f"No such object: {bucket}/{name}")
        return None

    def _list(self, req: Request, bucket: str) -> Reply:
        if gone := self._missing(bucket):
            return gone
        prefix, delimiter = req.query.get("prefix", ""), req.query.get("delimiter", "")
        entries: dict[str, bool] = {}  # a name or a prefix → whether it is a prefix
        for name in (n for n in self.buckets[bucket] if n.startswith(prefix)):
            rest = name[len(prefix) :]
            if delimiter and delimiter in rest:
                entries[prefix + rest[: rest.index(delimiter) + len(delimiter)]] = True
            else:
                entries[name] = False
        after = base64.urlsafe_b64decode(req.query.get("pageToken", "")).decode()
        page = sorted(e for e in entries if e > after)
        size = min(int(req.query.get("maxResults", 1000)), 1000)
        body: dict[str, Any] = {"kind": "storage#objects"}
        if len(page) > size:
            page = page[:size]
            body["nextPageToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
        if prefixes := [e for e in page if entries[e]]:
            body["prefixes"] = prefixes
        objects = self.buckets[bucket]
        if items := [
            self.resource(req.host, bucket, e, objects[e]) for e in page if not entries[e]
        ]:
            body["items"] = items
        return _json(body)

    def _object(self, req: Request, bucket: str, name: str, media: bool) -> Reply:
        if gone := self._missing(bucket, name):
            return gone
        obj = self.buckets[bucket][name]
        if req.method == "DELETE":
            del self.buckets[bucket][name]
            return 204, {}, b""
        if req.method != "GET":
            return _error(405, "methodNotAllowed", f"{req.method} is not allowed here")
        if not media:
            return _json(self.resource(req.host, bucket, name, obj))
        size = len(obj.data)
        headers = {
            "Content-Type": obj.content_type, "X-Goog-Generation": str(obj.generation),
            "X-Goog-Metageneration": "1", "X-Goog-Stored-Content-Length": str(size),
            "X-Goog-Stored-Content-Encoding": "identity",
            "X-Goog-Hash": f"crc32c={_crc32c(obj.data)},md5={_md5(obj.data)}",
        }  # fmt: skip
        asked = _RANGE.fullmatch(req.headers.get("range", "").strip())
        if not asked or asked.groups() == ("", ""):
            return 200, headers, obj.data
        first, last = asked.groups()
        start = int(first) if first else max(size - int(last), 0)
        end = min(int(last), size - 1) if first and last else size - 1
        if start >= size:
            return _error(416, "requestedRangeNotSatisfiable", "Request range not satisfiable")
        return (
            206,
            headers | {"Content-Range": f"bytes {start}-{end}/{size}"},
            obj.data[start : end + 1],
        )

    def _parts(self, req: Request) -> tuple[str, dict[str, Any], bytes, str]:
        """An upload's object name, its metadata, its bytes and their type, as the request
        carries them (a multipart body's first part is the metadata, its second the media)."""
        kind = req.headers.get("content-type", "application/octet-stream")
        meta: dict[str, Any] = {}
        media, media_type = req.body, kind
        if kind.startswith("multipart/related"):
            head = f"Content-Type: {kind}\r\n\r\n".encode()
            parts: Any = BytesParser().parsebytes(head + req.body).get_payload()
            if isinstance(parts, list) and len(parts) == 2:
                meta = json.loads(parts[0].get_payload(decode=True) or b"{}")
                media, media_type = parts[1].get_payload(decode=True), parts[1].get_content_type()
        elif kind.startswith("application/json") and req.body:
            meta = json.loads(req.body)
        name = req.query.get("name") or str(meta.get("name", ""))
        return name, meta, media, str(meta.get("contentType") or media_type)

    def _store(self, req: Request, bucket: str, name: str, data: bytes, kind: str,
               hashes: dict[str, Any]) -> Reply:  # fmt: skip
        for key, value in (("crc32c", _crc32c(data)), ("md5Hash", _md5(data))):
            if hashes.get(key) not in (None, value):
                return _error(400, "invalid", f"Provided {key} {hashes[key]!r} doesn't match "
                                              f"calculated {key} {value!r}.")  # fmt: skip
        obj = self.buckets[bucket][name] = Obj(data, kind)
        return _json(self.resource(req.host, bucket, name, obj))

    def _upload(self, req: Request, bucket: str, name: str, meta: dict[str, Any], data: bytes,
                kind: str) -> Reply:  # fmt: skip
        if gone := self._missing(bucket):
            return gone
        how = req.query.get("uploadType")
        if req.method != "POST" or how not in ("media", "multipart", "resumable") or not name:
            return _error(400, "invalid", "Upload requests must include an uploadType and name")
        if how != "resumable":
            return self._store(req, bucket, name, data, kind, meta)
        upload_id = secrets.token_urlsafe(16)
        kind = meta.get("contentType") or req.headers.get("x-upload-content-type") or kind
        self.uploads[upload_id] = {"name": name, "data": b"", "done": None, "type": kind}
        where = f"b/{bucket}/o?uploadType=resumable&name={quote(name, safe='')}"
        return 200, {"Location": f"http://{req.host}/upload/storage/v1/{where}"
                                 f"&upload_id={upload_id}"}, b""  # fmt: skip

    def _chunk(self, req: Request, bucket: str, upload: dict[str, Any]) -> Reply:
        if upload["done"] is not None:
            done: Reply = upload["done"]
            return done
        said = _CONTENT_RANGE.fullmatch(req.headers.get("content-range", ""))
        if said is None or req.method != "PUT":
            return _error(400, "invalid", "Failed to parse Content-Range header.")
        first, total = said.groups()
        had = len(upload["data"])
        if first is not None:
            if int(first) > had:
                return _error(400, "invalid", f"Chunk starts at {first}; {had} bytes persisted")
            upload["data"] += req.body[had - int(first) :]
        final = total != "*" and len(upload["data"]) >= int(total)
        if final and len(upload["data"]) != int(total):
            return _error(400, "invalid", "Upload is larger than its declared size")
        if not final:
            kept = len(upload["data"]) // _QUANTUM * _QUANTUM if first is not None else had
            upload["data"] = upload["data"][:kept]
            return 308, {"Range": f"bytes=0-{kept - 1}"} if kept else {}, b""
        said_hash = req.headers.get("x-goog-hash", "")
        hashes = {("md5Hash" if k == "md5" else k): v
                  for k, _, v in (h.partition("=") for h in said_hash.split(",") if h)}  # fmt: skip
        upload["done"] = self._store(req, bucket, upload["name"], upload["data"], upload["type"],
                                     hashes)  # fmt: skip
        return self._chunk(req, bucket, upload)

    def _rewrite(self, req: Request, bucket: str, source: str, dest: str, name: str) -> Reply:
        if gone := self._missing(bucket, source) or self._missing(dest):
            return gone
        token = req.query.get("rewriteToken")
        if token is None:
            token = secrets.token_urlsafe(16)
            self.rewrites[token] = {"from": (bucket, source), "to": (dest, name), "done": 0,
                                    "obj": self.buckets[bucket][source]}  # fmt: skip
        state = self.rewrites.get(token)
        if state is None or (state["from"], state["to"]) != ((bucket, source), (dest, name)):
            return _error(400, "invalid", "Invalid rewrite token.")
        obj: Obj = state["obj"]
        step = min(int(req.query.get("maxBytesRewrittenPerCall", REWRITE_STEP)), REWRITE_STEP)
        state["done"] = min(state["done"] + step, len(obj.data))
        body: dict[str, Any] = {"kind": "storage#rewriteResponse", "done": False,
                                "totalBytesRewritten": str(state["done"]),
                                "objectSize": str(len(obj.data))}  # fmt: skip
        if state["done"] < len(obj.data):
            return _json(body | {"rewriteToken": token})
        del self.rewrites[token]
        kind = json.loads(req.body or b"{}").get("contentType") or obj.content_type
        copied = self.buckets[dest][name] = Obj(obj.data, kind)
        return _json(body | {"done": True, "resource": self.resource(req.host, dest, name, copied)})

    def _batch(self, req: Request) -> Reply:
        """Each part an HTTP request of its own (``application/http``), answered in a part of
        the same Content-ID's ``response-``."""
        head = f"Content-Type: {req.headers.get('content-type', '')}\r\n\r\n".encode()
        message = BytesParser().parsebytes(head + req.body)
        boundary = f"batch_{secrets.token_hex(12)}"
        out = []
        parts: Any = message.get_payload() if message.is_multipart() else []
        for part in parts:
            text = str(part.get_payload()).replace("\r\n", "\n")
            lines, _, body = text.partition("\n\n")
            line, *said = lines.split("\n")
            method, uri, _ = line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in said)}
            url = urlsplit(uri)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            sub = Request(method, url.path, query, headers, body.encode(), req.host)
            status, got, answer = self.answer(sub)
            got = got | {"Content-Length": str(len(answer))}
            asked = part["Content-ID"]
            named = f"Content-ID: <response-{str(asked).strip('<>')}>\r\n" if asked else ""
            out.append(
                f"--{boundary}\r\nContent-Type: application/http\r\n{named}\r\n"
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in got.items())
                + f"\r\n{answer.decode()}\r\n"
            )
        whole = ("".join(out) + f"--{boundary}--\r\n").encode()
        return 200, {"Content-Type": f"multipart/mixed; boundary={boundary}"}, whole
