"""torchrun's c10d rendezvous with its store listening on one address, not on every interface.

torch's own ``c10d`` backend makes the head agent's `TCPStore` listen on ``*:PORT``, with no
authentication, and the elastic rendezvous unpickles what it reads from that store: on a laptop
on a shared network (the local provider), or a host of the ssh provider, anyone who reaches the
port can join the job or worse. This backend is the same rendezvous (torch's
`DynamicRendezvousHandler` over `C10dRendezvousBackend`), whose store listens only on the
endpoint's own address: the head's private address, or loopback for local nodes; so does the
second store torch's head agent hosts for the workers' process group (``--local-addr``). A job
opens no other listening TCP port but its process group's transport's, which gloo and NCCL bind
to ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``. One mend to torch's rendezvous: an agent that
joins a later round (an elastic job's node made again) gets that round's workers' store
(`each_round`).

It runs on the node, inside torchrun's agent (which imported torch already); it lives here, not
in `cloudtrain.runtime`, because torchrun loads every plugin of its group at start: importing
this module costs nothing but itself.

torchrun finds it through its documented plugin group (``torchrun.handlers`` in
pyproject.toml): ``--rdzv-backend cloudtrain``. It needs ``--rdzv-conf is_host=0|1`` (cloudtrain
always says which agent hosts the store) and takes torch's other c10d settings.
"""

from __future__ import annotations

import errno
import logging
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.elastic.rendezvous import (
        RendezvousHandler,
        RendezvousInfo,
        RendezvousParameters,
    )

log = logging.getLogger(__name__)

#: The name torchrun knows it by (``--rdzv-backend``).
BACKEND = "cloudtrain"
DEFAULT_PORT = 29400


def listener(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host` alone (an IPv4 or IPv6 address, or a name). An address
    this machine does not have (an ssh host named by the public address of a NAT in front of
    it) cannot be listened on: then every interface is, as torch's own backend does, and the
    agent's log says so."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        if exc.errno != errno.EADDRNOTAVAIL:
            sock.close()
            raise
        log.warning(
            "%s is not an address of this machine (%s): the rendezvous store listens "
            "on every interface",
            host,
            exc,
        )
        sock.bind(("::" if family == socket.AF_INET6 else "", port))
    sock.listen(socket.SOMAXCONN)
    return sock


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """What torchrun calls for ``--rdzv-backend cloudtrain``."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported from torch._C
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        create_handler as dynamic_handler,
    )
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
    is_host = params.get_as_bool("is_host")
    if is_host is None:
        raise ValueError(f"--rdzv-backend {BACKEND} needs --rdzv-conf is_host=0 or 1")
    timeout = timedelta(seconds=int(params.get_as_int("read_timeout", 60) or 60))
    extra: dict[str, Any] = {}
    sock: socket.socket | None = None
    try:
        if is_host:
            sock = listener(host, port)
            extra = {"master_listen_fd": sock.fileno(), "wait_for_workers": False}
        store = TCPStore(host, port, is_master=is_host, timeout=timeout, **extra)
    except (OSError, RuntimeError, ValueError) as exc:
        if sock is not None:
            sock.close()
        raise RendezvousConnectionError(
            f"the rendezvous store at {host}:{port} could not be "
            f"{'opened' if is_host else 'reached'}: {exc}"
        ) from exc
    if sock is not None:  # the store owns the descriptor now: torch closes it with the store
        sock.detach()

    class Backend(C10dRendezvousBackend):  # torch's, under the name torchrun asked for
        @property
        def name(self) -> str:
            return BACKEND

    handler = dynamic_handler(store, Backend(store, params.run_id), params)
    # The rank-0 agent hosts a second store for the workers' process group (torch's store
    # sharing), made by this method with no address to listen on: give it one.
    if not hasattr(handler, SHARED_STORE_HOOK):
        raise RuntimeError(
            f"this torch has no {SHARED_STORE_HOOK}; cloudtrain cannot bind its "
            "workers' store to one address"
        )
    setattr(handler, SHARED_STORE_HOOK, bound_store)
    handler.next_rendezvous = each_round(handler)  # type: ignore[method-assign]
    return handler


def each_round(handler: RendezvousHandler) -> Callable[[], RendezvousInfo]:
    """`handler`'s ``next_rendezvous``, which gives every agent of each round the workers' store
    of that round's rank 0.

    torch's store sharing writes the store's address (``MASTER_ADDR``, ``MASTER_PORT``) under a
    round's prefix only when an agent first becomes rank 0; an agent reads it only at its
    first round. So an agent that joins a later round (an elastic job's node made again, which
    arrived after the others formed a round without it) waits for an address no one writes,
    and the others wait for it: both fail after the store's timeout (60 s). And an agent whose
    rank changed keeps the address of the round it first read. Here rank 0 writes its store's
    address in every round, and every other agent reads it there."""
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo

    first = handler.next_rendezvous

    def next_rendezvous() -> RendezvousInfo:
        info = first()
        shared = info.bootstrap_store_info
        if not handler.use_agent_store or shared is None:
            return info  # each round's rank 0 makes the workers' store (torch's own way)
        if info.rank == 0:
            info.store.set(RendezvousStoreInfo.MASTER_ADDR_KEY, shared.master_addr)
            info.store.set(RendezvousStoreInfo.MASTER_PORT_KEY, str(shared.master_port))
            return info
        this_round = RendezvousStoreInfo.build(info.rank, info.store, local_addr=None)
        return RendezvousInfo(info.store, info.rank, info.world_size, this_round)

    return next_rendezvous


#: The `DynamicRendezvousHandler` method (torch 2.4 and later) that makes the workers' store.
SHARED_STORE_HOOK = "_create_tcp_store_server"


def bound_store(host: str, port: int) -> Any:
    """A master `TCPStore` listening on `host` alone (`port` 0: a free one)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported from torch._C

    sock = listener(host, port)
    try:
        store = TCPStore(
            host,
            sock.getsockname()[1],
            is_master=True,
            multi_tenant=True,
            master_listen_fd=sock.fileno(),
            wait_for_workers=False,
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now: torch closes it with the store
    return store


def handler() -> Any:
    """The entry point torchrun loads (``torchrun.handlers``): it returns the creator."""
    return create_handler
