"""What the clouds' stand-ins answer when a test asks for an answer no cloud API sends: a
proxy's HTML page, a garbled or cut-short body, a connection closed unanswered; and the check
that cloudtrain turned it into one line."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Protocol

#: nginx's page for a backend that did not answer
BAD_GATEWAY = (
    b"<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n"
    b"<body>\n<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx</center>\n"
    b"</body>\n</html>\n"
)


class Raw(Protocol):
    """An answer sent as it is: `body` under `status`; `length`, when set, is the
    ``Content-Length`` claimed (more than `body` cuts it short); `drop` closes the connection
    without answering."""

    status: int
    body: bytes
    content_type: str
    length: int | None
    drop: bool


def send_raw(handler: BaseHTTPRequestHandler, fault: Raw) -> None:
    """Answer `handler`'s request with `fault`, then close the connection."""
    handler.close_connection = True
    if fault.drop:
        return
    handler.send_response(fault.status)
    handler.send_header("Content-Type", fault.content_type)
    claimed = len(fault.body) if fault.length is None else fault.length
    handler.send_header("Content-Length", str(claimed))
    handler.end_headers()
    handler.wfile.write(fault.body)


def one_line(exc: BaseException) -> str:
    """`exc`'s message, checked to be one line of a readable length."""
    text = str(exc)
    assert "\n" not in text, text
    assert len(text) < 600, text
    return text
