"""cloudtrain's torchrun rendezvous backend: its stores listen on one address."""

from __future__ import annotations

import socket
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

import pytest

from cloudtrain.jobs import rendezvous

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler


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


def test_an_agent_that_joins_a_later_round_gets_that_rounds_workers_store() -> None:
    """An elastic job's node made again joins after the others formed a round without it: its
    agent gets the workers' store of the new round's rank 0 at once, as its peers do (torch's
    store sharing wrote that address only in the first round: the newcomer waited for it until
    the store's timeout, and its peers for the newcomer)."""
    pytest.importorskip("torch")
    import threading
    import time

    from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousParameters

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    def agent(is_host: int) -> RendezvousHandler:
        params = RendezvousParameters(
            backend=rendezvous.BACKEND, endpoint=f"127.0.0.1:{port}", run_id="job-1",
            min_nodes=1, max_nodes=2, local_addr="127.0.0.1", is_host=is_host,
            last_call_timeout=1, read_timeout=20,
        )  # fmt: skip
        return rendezvous.create_handler(params)

    head = agent(1)
    alone = head.next_rendezvous()  # the survivor's round, without the newcomer
    assert (alone.rank, alone.world_size) == (0, 1)
    newcomer = agent(0)
    got: list[RendezvousInfo] = []
    joining = threading.Thread(target=lambda: got.append(newcomer.next_rendezvous()))
    started = time.monotonic()
    joining.start()
    deadline = time.monotonic() + 30
    while head.num_nodes_waiting() == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # torchrun's agent sees the newcomer waiting, and rendezvous again
    again = head.next_rendezvous()
    joining.join(30)
    try:
        assert got, "the newcomer's rendezvous did not end"
        assert time.monotonic() - started < 15  # not the store's timeout (20 s)
        assert (again.world_size, got[0].world_size) == (2, 2)
        assert {again.rank, got[0].rank} == {0, 1}
        head_store, its_store = again.bootstrap_store_info, got[0].bootstrap_store_info
        assert head_store is not None
        assert its_store is not None
        assert (its_store.master_addr, its_store.master_port) == (
            head_store.master_addr,
            head_store.master_port,
        )
    finally:
        head.shutdown()
        newcomer.shutdown()
