"""cloudtrain's torchrun rendezvous backend: its stores listen on one address."""

from __future__ import annotations

import socket
from importlib.metadata import entry_points

import pytest

from cloudtrain.jobs import rendezvous


def test_torchrun_finds_the_backend_by_its_plugin_group() -> None:
    found = {e.name: e for e in entry_points(group="torchrun.handlers")}
    assert found[rendezvous.BACKEND].load()() is rendezvous.create_handler


def test_a_listener_is_bound_to_the_address_asked() -> None:
    sock = rendezvous.listener("127.0.0.1", 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_an_address_this_machine_lacks_falls_back_to_every_interface(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sock = rendezvous.listener("192.0.2.1", 0)  # TEST-NET-1: never an address of this machine
    try:
        assert sock.getsockname()[0] == "0.0.0.0"
        assert "is not an address of this machine" in caplog.text
    finally:
        sock.close()


def test_the_workers_store_listens_on_the_agents_address(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    bound: list[tuple[str, int]] = []

    def recording(host: str, port: int) -> socket.socket:
        sock = listener(host, port)
        bound.append(sock.getsockname())
        return sock

    listener = rendezvous.listener
    monkeypatch.setattr(rendezvous, "listener", recording)
    store = rendezvous.bound_store("127.0.0.1", 0)
    store.set("k", "v")
    assert bound == [("127.0.0.1", store.port)]
    assert store.get("k") == b"v"
    probe = socket.create_connection(("127.0.0.1", store.port), timeout=5)
    probe.close()
