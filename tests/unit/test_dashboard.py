"""The dashboard's server over real HTTP on 127.0.0.1 (`cloudtrain.dashboard`): who it answers
(the one-time link, the cookie, the Host), what it sends (a state snapshot, a job's metrics)
and the headers that keep the page to itself. The page in a real browser:
tests/integration/test_dashboard.py."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain import dashboard
from cloudtrain.dashboard import Dashboard
from cloudtrain.jobs import metrics
from cloudtrain.records import ClusterStatus
from cloudtrain.spec import ClusterSpec, Resources
from cloudtrain.state import State


@pytest.fixture
def board(tmp_path: Path) -> Iterator[Dashboard]:
    with State.open(tmp_path) as state:
        state.put_cluster(ClusterSpec("demo", "local", 2, Resources()), status=ClusterStatus.UP,
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


def login(board: Dashboard, host: str | None = None) -> tuple[int, dict[str, str]]:
    """Follow a new one-time link by hand: its status and headers."""
    link = board.login_url()
    assert link.startswith(f"http://127.0.0.1:{board.port}/login?once=")
    assert board.token not in link
    status, headers, _ = get(board, link.split(str(board.port), 1)[1], host=host)
    return status, headers


def session(board: Dashboard) -> str:
    status, headers = login(board)
    assert status == 303
    return headers["Set-Cookie"].split(";")[0]


def test_a_link_works_once_sets_the_cookie_and_carries_no_token(board: Dashboard) -> None:
    link = board.login_url()
    path = link.split(str(board.port), 1)[1]
    status, headers, body = get(board, path)
    assert status == 303
    assert headers["Location"] == "/"
    assert headers["Set-Cookie"] == (
        f"cloudtrain_dashboard={board.token}; HttpOnly; SameSite=Strict; Path=/"
    )
    assert body == b""
    again, headers, body = get(board, path)
    assert again == 403, "spent at its first use"
    assert "Set-Cookie" not in headers
    assert b"used already" in body
    assert get(board, "/login?once=made-up")[0] == 403
    assert get(board, "/login")[0] == 403
    cookie = f"cloudtrain_dashboard={board.token}"
    assert get(board, path, cookie=cookie)[0] == 303, "a browser that has the cookie"
    assert get(board, "/api/state", cookie=cookie)[0] == 200
    assert board.login_url() != link, "a new nonce each time"


def test_a_link_not_used_in_time_is_void(board: Dashboard, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard, "LOGIN_S", -1.0)
    assert login(board)[0] == 403
    monkeypatch.setattr(dashboard, "LOGIN_S", 120.0)
    assert login(board)[0] == 303


def test_without_the_cookie_or_from_another_name_nothing_but_403(board: Dashboard) -> None:
    for path in ("/", "/api/state", "/api/metrics?job=demo-1", f"/api/state?token={board.token}"):
        assert get(board, path)[0] == 403, "no token in a URL, ever"
    cookie = session(board)
    assert get(board, "/api/state", cookie="cloudtrain_dashboard=wrong")[0] == 403
    assert get(board, "/api/state", cookie='cloudtrain_dashboard="x;')[0] == 403
    assert get(board, "/api/state", host=f"evil.example:{board.port}", cookie=cookie)[0] == 403
    assert get(board, "/api/state", host="127.0.0.1:1", cookie=cookie)[0] == 403
    assert get(board, "/api/state", host=f"localhost:{board.port}", cookie=cookie)[0] == 200
    # a page elsewhere that rebinds a name to 127.0.0.1 can neither use nor spend a link
    link = board.login_url().split(str(board.port), 1)[1]
    assert get(board, link, host=f"evil.example:{board.port}")[0] == 403
    assert get(board, link)[0] == 303, "still good"


def test_the_page_gets_a_nonce_and_a_policy_that_allows_only_itself(board: Dashboard) -> None:
    cookie = session(board)
    status, headers, body = get(board, "/", cookie=cookie)
    assert status == 200
    policy = headers["Content-Security-Policy"]
    nonce = policy.split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">' in body.decode()
    assert "default-src 'none'" in policy
    assert "connect-src 'self'" in policy
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "no-store"
    assert board.token not in body.decode()
    assert "location.search" not in body.decode(), "the page reads nothing from its URL"
    again = get(board, "/", cookie=cookie)[1]["Content-Security-Policy"]
    assert again != policy, "a nonce per page"


def test_the_state_and_a_jobs_metrics_as_json(board: Dashboard) -> None:
    cookie = session(board)
    status, _, body = get(board, "/api/state", cookie=cookie)
    assert status == 200
    snap = json.loads(body)
    assert [(c["name"], c["nodes"], c["price_per_hour"]) for c in snap["clusters"]] == [
        ("demo", 0, 3.0)
    ]
    assert [(j["id"], j["status"]) for j in snap["jobs"]] == [("demo-1", "pending")]
    assert (
        snap["events"][-1]["message"] == "job demo-1 <script>alert(1)</script>"
    )  # data: the page puts text
    lines = json.loads(get(board, "/api/metrics?job=demo-1", cookie=cookie)[2])
    assert lines == [{"attempt": 0, "step": 5, "at": 1.0, "rank": 0, "loss": 0.5}]
    assert get(board, "/api/metrics?job=../../etc", cookie=cookie)[0] == 400
    assert get(board, "/nope", cookie=cookie)[0] == 404


def test_close_ends_the_connections_still_open(board: Dashboard) -> None:
    """A browser's speculative connection that never asks: `close` ends it and its thread."""
    before = set(threading.enumerate())  # another test's board (xdist) is not this one's
    idle = socket.create_connection(("127.0.0.1", board.port), timeout=5)
    with idle:
        assert get(board, "/api/state", cookie=session(board))[0] == 200  # served meanwhile
        board.close()
        assert idle.recv(1) == b"", "the dashboard closed its end"
    handlers = [t for t in threading.enumerate() if "process_request" in t.name and t not in before]
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
