"""The dashboard's server over real HTTP on 127.0.0.1 (`cloudtrain.dashboard`): who it answers
(the token, the Host), what it sends (a state snapshot, a job's metrics) and the headers that
keep the page to itself. The page in a real browser: tests/integration/test_dashboard.py."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.dashboard import Dashboard
from cloudtrain.jobs import metrics
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State


@pytest.fixture
def board(tmp_path: Path) -> Iterator[Dashboard]:
    with State.open(tmp_path) as state:
        state.put_cluster(ClusterSpec("demo", "local", 2, Resources()), status="up",
                          price_per_hour=3.0)  # fmt: skip
        job = state.new_job("demo", "digits", num_nodes=2, nproc_per_node=1, command=["x.py"])
        state.add_event("demo", "job", "job demo-1 <script>alert(1)</script>", job_id=job.id)
    copy = metrics.copy_path(tmp_path, "demo-1", 0, 0)
    copy.parent.mkdir(parents=True)
    copy.write_text('{"step": 5, "at": 1.0, "rank": 0, "loss": 0.5}\n')
    server = Dashboard(tmp_path)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server
    server.close()
    thread.join(timeout=5)


def get(
    board: Dashboard, path: str, host: str | None = None, cookie: str = ""
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", board.port, timeout=10)
    headers = {"Host": host or f"127.0.0.1:{board.port}"}
    if cookie:
        headers["Cookie"] = cookie
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), body


def test_without_the_token_or_from_another_name_nothing_but_403(board: Dashboard) -> None:
    for path in ("/", "/api/state", "/api/metrics?job=demo-1", "/api/state?token=wrong"):
        assert get(board, path)[0] == 403
    token = f"token={board.token}"
    assert get(board, f"/api/state?{token}", host=f"evil.example:{board.port}")[0] == 403
    assert get(board, f"/api/state?{token}", host="127.0.0.1:1")[0] == 403
    assert get(board, f"/api/state?{token}", host=f"localhost:{board.port}")[0] == 200
    assert board.url == f"http://127.0.0.1:{board.port}/?token={board.token}"


def test_the_page_gets_a_cookie_a_nonce_and_a_policy_that_allows_only_itself(
    board: Dashboard,
) -> None:
    status, headers, body = get(board, f"/?token={board.token}")
    assert status == 200
    policy = headers["Content-Security-Policy"]
    nonce = policy.split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">' in body.decode()
    assert "default-src 'none'" in policy
    assert "connect-src 'self'" in policy
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "no-store"
    cookie = headers["Set-Cookie"]
    assert cookie == f"cloudtrain_dashboard={board.token}; HttpOnly; SameSite=Strict; Path=/"
    assert get(board, "/api/state", cookie=cookie.split(";")[0])[0] == 200
    again = get(board, f"/?token={board.token}")[1]["Content-Security-Policy"]
    assert again != policy, "a nonce per page"


def test_the_state_and_a_jobs_metrics_as_json(board: Dashboard) -> None:
    status, _, body = get(board, f"/api/state?token={board.token}")
    assert status == 200
    snap = json.loads(body)
    assert [(c["name"], c["nodes"], c["price_per_hour"]) for c in snap["clusters"]] == [
        ("demo", 0, 3.0)
    ]
    assert [(j["id"], j["status"]) for j in snap["jobs"]] == [("demo-1", "pending")]
    assert (
        snap["events"][-1]["message"] == "job demo-1 <script>alert(1)</script>"
    )  # data: the page puts text
    lines = json.loads(get(board, f"/api/metrics?job=demo-1&token={board.token}")[2])
    assert lines == [{"attempt": 0, "step": 5, "at": 1.0, "rank": 0, "loss": 0.5}]
    assert get(board, f"/api/metrics?job=../../etc&token={board.token}")[0] == 400
    assert get(board, f"/nope?token={board.token}")[0] == 404


def test_close_ends_the_connections_still_open(board: Dashboard) -> None:
    """A browser's speculative connection that never asks: `close` ends it and its thread."""
    idle = socket.create_connection(("127.0.0.1", board.port), timeout=5)
    with idle:
        assert get(board, f"/api/state?token={board.token}")[0] == 200  # served meanwhile
        board.close()
        assert idle.recv(1) == b"", "the dashboard closed its end"
    handlers = [t for t in threading.enumerate() if "process_request" in t.name]
    assert handlers == [], "no handler thread outlives the dashboard"


def test_a_dashboard_never_served_closes_at_once_and_serves_no_more(tmp_path: Path) -> None:
    board = Dashboard(tmp_path)
    closing = threading.Thread(target=board.close, daemon=True)
    closing.start()
    closing.join(timeout=5)
    assert not closing.is_alive(), "close() waited for a serve() that never began"
    board.close()  # idempotent
    board.serve()  # returns at once: it is closed
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", board.port), timeout=5).close()
