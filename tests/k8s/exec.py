"""``pods/exec`` over a WebSocket, as kube-apiserver and the kubelet serve it (stdlib only).

The client (the official ``kubernetes.stream.stream``, ``kubectl exec``) sends
``GET …/pods/NAME/exec?command=a&command=b&stdin=true&stdout=true&stderr=true`` with
``Upgrade: websocket`` and offers subprotocols; the server answers 101 with
``Sec-WebSocket-Accept`` = base64(sha1(key + GUID)) (RFC 6455 §4.2.2) and the first offered
protocol it speaks: ``v5.channel.k8s.io`` or ``v4.channel.k8s.io``.

Every data frame's first byte is its channel:

=========  ================  ===============================================================
channel    direction         carries
=========  ================  ===============================================================
0          client → server   stdin
1, 2       server → client   stdout, stderr, as the process writes them
3          server → client   at the end, one JSON ``Status``: ``Success``, or ``Failure`` with
                             reason ``NonZeroExitCode`` and the code as ``details.causes[0]``
                             (the client's ``returncode`` reads it), or ``InternalError``
4          client → server   terminal resize (ignored: no tty here)
255        client → server   v5 only: ``[255, n]`` closes channel n (``[255, 0]``: stdin EOF)
=========  ================  ===============================================================

Client frames are masked, the server's are not; control frames (ping, pong, close) may come
between the fragments of a message. Threads keep the directions apart, so a large stdin (a
tar stream) never waits on output: one reads the socket into a queue, one feeds the process,
one per output pipe writes frames. After the status, the server sends a close frame.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import queue
import socket
import struct
import subprocess
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, BinaryIO

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
V4, V5 = "v4.channel.k8s.io", "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CONTINUATION, TEXT, BINARY, CLOSE_FRAME, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def accept(key: str) -> str:
    """``Sec-WebSocket-Accept`` for the client's ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def choose(offer: str) -> str | None:
    """The first protocol of the client's offer that the stand-in speaks."""
    for protocol in (p.strip() for p in offer.split(",")):
        if protocol in (V4, V5):
            return protocol
    return None


def handshake(handler: BaseHTTPRequestHandler, protocol: str) -> WebSocket:
    """Answers the upgrade (101) and returns the connection's WebSocket."""
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept(handler.headers["Sec-WebSocket-Key"]))
    handler.send_header("Sec-WebSocket-Protocol", protocol)
    handler.end_headers()
    handler.wfile.flush()
    handler.close_connection = True
    return WebSocket(handler.rfile, handler.wfile, handler.connection)


class WebSocket:
    """The server's end of one WebSocket (RFC 6455) over the request's socket."""

    def __init__(
        self, rfile: io.BufferedIOBase, wfile: io.BufferedIOBase, sock: socket.socket
    ) -> None:
        self.rfile, self.wfile, self.sock = rfile, wfile, sock
        self.lock = threading.Lock()
        self.closed = False  # a close frame was sent

    def send(self, opcode: int, payload: bytes) -> None:
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        with self.lock:
            if self.closed:
                return
            self.closed = opcode == CLOSE_FRAME
            self.wfile.write(head + payload)
            self.wfile.flush()

    def channel(self, number: int, data: bytes) -> None:
        self.send(BINARY, bytes([number]) + data)

    def close(self, code: int = 1000) -> None:
        with contextlib.suppress(OSError):
            self.send(CLOSE_FRAME, struct.pack("!H", code))

    def _frame(self) -> tuple[bool, int, bytes] | None:
        head = _exactly(self.rfile, 2)
        if head is None:
            return None
        fin, opcode = bool(head[0] & 0x80), head[0] & 0x0F
        masked, size = bool(head[1] & 0x80), head[1] & 0x7F
        if size == 126:
            more = _exactly(self.rfile, 2)
            size = struct.unpack("!H", more)[0] if more else -1
        elif size == 127:
            more = _exactly(self.rfile, 8)
            size = struct.unpack("!Q", more)[0] if more else -1
        mask = _exactly(self.rfile, 4) if masked else b"\0\0\0\0"
        payload = _exactly(self.rfile, size) if size >= 0 and mask is not None else None
        if payload is None or mask is None:
            return None
        if masked:
            payload = _unmask(payload, mask)
        return fin, opcode, payload

    def receive(self) -> tuple[int, bytes] | None:
        """The next whole message (TEXT or BINARY, fragments joined), or CLOSE_FRAME; pings
        are answered on the way. None: the connection ended."""
        opcode, parts = -1, list[bytes]()
        while True:
            frame = self._frame()
            if frame is None:
                return None
            fin, op, payload = frame
            if op == PING:
                self.send(PONG, payload)
                continue
            if op == PONG:
                continue
            if op == CLOSE_FRAME:
                return CLOSE_FRAME, payload
            if op != CONTINUATION:
                opcode, parts = op, []
            parts.append(payload)
            if fin:
                return opcode, b"".join(parts)


def _exactly(stream: io.BufferedIOBase, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        try:
            chunk = stream.read(size - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def _unmask(payload: bytes, mask: bytes) -> bytes:
    size = len(payload)
    key = int.from_bytes((mask * (size // 4 + 1))[:size], "big")
    return (int.from_bytes(payload, "big") ^ key).to_bytes(size, "big")


# -- one exec session -------------------------------------------------------------------------


def failure(argv: list[str], code: int) -> dict[str, Any]:
    """The kubelet's Status for a command that exited with `code` (≠ 0)."""
    command = "[" + " ".join(argv) + "]"
    return {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: error executing command "
        f"{command}, exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def internal(argv: list[str], exc: OSError) -> dict[str, Any]:
    """The kubelet's Status for a command the runtime could not start."""
    why = (
        "executable file not found in $PATH"
        if isinstance(exc, FileNotFoundError)
        else exc.strerror or str(exc)
    )
    cause = (
        "error executing command in container: failed to exec in container: failed to start "
        f'exec "standin": OCI runtime exec failed: exec failed: unable to start container '
        f'process: exec: "{argv[0] if argv else ""}": {why}: unknown'
    )
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"Internal error occurred: {cause}",
        "reason": "InternalError",
        "details": {"causes": [{"message": cause}]},
        "code": 500,
    }


def session(
    ws: WebSocket,
    protocol: str,
    argv: list[str],
    proc: subprocess.Popen[bytes] | OSError,
    stdin: bool,
) -> int | None:
    """Runs one exec to its end over `ws`; returns the exit code (None: it never started)."""
    if isinstance(proc, OSError):
        _finish(ws, internal(argv, proc))
        return None
    feed: queue.Queue[bytes | None] = queue.Queue()
    reader = threading.Thread(target=_read_socket, args=(ws, protocol, feed), daemon=True)
    reader.start()
    writer = threading.Thread(target=_feed, args=(proc, feed if stdin else None), daemon=True)
    writer.start()
    pumps = [
        threading.Thread(target=_pump, args=(ws, number, pipe), daemon=True)
        for number, pipe in ((STDOUT, proc.stdout), (STDERR, proc.stderr))
        if pipe is not None
    ]
    for pump in pumps:
        pump.start()
    code = proc.wait()
    for pump in pumps:
        pump.join()
    if code < 0:
        code = 128 - code  # killed by a signal, as the runtime reports it
    _finish(ws, {"metadata": {}, "status": "Success"} if code == 0 else failure(argv, code))
    reader.join(2)  # the client answers the close frame
    feed.put(None)
    return code


def _finish(ws: WebSocket, status: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        ws.channel(ERROR, json.dumps(status).encode())
    ws.close()
    with contextlib.suppress(OSError):
        ws.sock.shutdown(socket.SHUT_WR)


def _read_socket(ws: WebSocket, protocol: str, feed: queue.Queue[bytes | None]) -> None:
    while True:
        message = ws.receive()
        if message is None or message[0] == CLOSE_FRAME:
            feed.put(None)
            if message is not None:
                ws.close()
            return
        opcode, data = message
        if opcode not in (TEXT, BINARY) or not data:
            continue
        if data[0] == STDIN:
            feed.put(data[1:])
        elif data[0] == CLOSE and protocol == V5 and data[1:2] == bytes([STDIN]):
            feed.put(None)


def _feed(proc: subprocess.Popen[bytes], feed: queue.Queue[bytes | None] | None) -> None:
    """Copies stdin from the socket's queue to the process; closes it at the end of input."""
    assert proc.stdin is not None
    try:
        while feed is not None:
            data = feed.get()
            if data is None:
                break
            proc.stdin.write(data)
            proc.stdin.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass
    with contextlib.suppress(OSError):
        proc.stdin.close()


def _pump(ws: WebSocket, number: int, pipe: BinaryIO) -> None:
    """Copies the process's stdout or stderr to the socket. When the client is gone, the pipe
    is closed, as the container runtime closes the exec's streams: the process's next write
    fails (SIGPIPE), so a command that writes without end ends with its client."""
    with pipe:
        while chunk := os.read(pipe.fileno(), 65536):
            try:
                ws.channel(number, chunk)
            except OSError:
                return
