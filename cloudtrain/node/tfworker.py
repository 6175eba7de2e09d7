"""A TensorFlow worker whose gRPC server listens on its own address in ``TF_CONFIG`` (the
node's private address; loopback on local nodes), not on every interface. Stdlib only::

    python -m cloudtrain.node.tfworker SCRIPT ARGS...     as ``python SCRIPT ARGS...``
    python -m cloudtrain.node.tfworker -m MODULE ARGS...  as ``python -m MODULE ARGS...``

TensorFlow's server (``GrpcServer::Init``, grpc_server_lib.cc) listens on ``0.0.0.0:PORT``
whatever the cluster spec says: the task's host is used only to name it, and neither
``TF_CONFIG``, the server's ``protocol`` or ``config``, nor a variable (``TF_GRPC_*``, gRPC's
own) changes that; ``ss -ltnp`` shows ``*:PORT``. The server runs sessions for anyone who
reaches the port (file writes and reads, as the job's user), so every interface is every
network the node is on.

So, once the script has imported ``tensorflow`` (its libraries loaded, no server started yet),
the ``bind`` that TensorFlow's libraries import from the C library is redirected, in their
global offset tables, to `bind_to`: a wildcard address becomes the worker's own (`own_host`);
any other address binds as asked. gRPC tries ``[::]`` first and falls back to ``0.0.0.0``: the
family the worker's address is not in is refused (``EADDRNOTAVAIL``), the other bound there.
An address this machine does not have (an ssh host named by the address of a NAT in front of
it) binds every interface, as torch's rendezvous does, with a line in the log.

The script gets ``TF_USE_LEGACY_KERAS=1`` unless the job sets it: ``tf.keras`` is then the Keras 2
of tf-keras (`cloudtrain.node.runtimes` installs it), with which MultiWorkerMirroredStrategy
works; with Keras 3, TensorFlow's own since 2.16, an ordinary ``model.fit`` under the strategy
fails on its ``PerReplica`` batches (tensorflow#72388, keras#20585).

Nothing is imported before the script: a script that sets TensorFlow's variables
(``TF_USE_LEGACY_KERAS``, ``CUDA_VISIBLE_DEVICES``) before its own import keeps them. The script
runs as the interpreter runs it: ``__name__ == "__main__"``, ``sys.argv``, an absolute
``__file__``, its folder first on ``sys.path``.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import importlib.abc
import importlib.machinery
import ipaddress
import json
import os
import runpy
import socket
import struct
import sys
import types
from collections.abc import Callable, Sequence
from importlib.machinery import SourceFileLoader
from pathlib import Path

__all__ = ["bind_to", "main", "own_host", "redirect_bind", "run"]

_AF_INET, _AF_INET6 = socket.AF_INET, socket.AF_INET6
_DT_NULL, _DT_PLTRELSZ, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ = 0, 2, 5, 6, 10
_DT_RELA, _DT_RELASZ, _DT_JMPREL, _DT_GNU_HASH, _DT_HASH = 7, 8, 23, 0x6FFFFEF5, 4
_PT_DYNAMIC = 2
#: The relocations that put a symbol's address in a slot, by table: JUMP_SLOT in the PLT's;
#: 64 / ABS64 and GLOB_DAT in the other (x86-64's numbers, then aarch64's).
_POINTER_RELOCS = {_DT_JMPREL: (7, 1026), _DT_RELA: (1, 6, 257, 1025)}
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_BIND = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32, use_errno=True
)
#: What the patched slots point at; kept alive for the life of the process.
_hooks: list[object] = []


def say(message: str) -> None:
    print(f"cloudtrain tfworker: {message}", file=sys.stderr, flush=True)


def own_host(tf_config: str | None) -> str | None:
    """The address of this worker's own task in `tf_config` (``TF_CONFIG``'s text), as a
    numeric address; None when there is no cluster or the task is not in it."""
    try:
        config = json.loads(tf_config or "")
        task = config["task"]
        hostport = config["cluster"][task["type"]][int(task["index"])]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(hostport, str):
        return None
    host = hostport.rpartition(":")[0].strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        return None


def _sockaddr(host: str, port_be: bytes) -> bytes:
    """A ``struct sockaddr_in``/``sockaddr_in6`` for `host`, its port as given (network order)."""
    address = ipaddress.ip_address(host)
    if address.version == 4:
        return _AF_INET.to_bytes(2, sys.byteorder) + port_be + address.packed + bytes(8)
    family = _AF_INET6.to_bytes(2, sys.byteorder)
    return family + port_be + bytes(4) + address.packed + bytes(4)


def bind_to(host: str, real: Callable[[int, bytes | int, int], int]) -> Callable[..., int]:
    """A C ``bind(fd, addr, len)`` that binds a wildcard address to `host` instead (the other
    family refused), through `real`; everything else as asked."""
    version = ipaddress.ip_address(host).version
    fell_back: list[bool] = []

    def hooked(fd: int, addr: int | None, length: int) -> int:
        if not addr or length < 8:
            return real(fd, addr or 0, length)
        raw = ctypes.string_at(addr, length)
        family = int.from_bytes(raw[:2], sys.byteorder)
        if family == _AF_INET and length >= 16 and raw[4:8] == bytes(4):
            mine = version == 4
        elif family == _AF_INET6 and length >= 24 and raw[8:24] == bytes(16):
            mine = version == 6
        else:
            return real(fd, addr, length)
        if fell_back:  # this machine lacks `host`: every interface, as asked
            return real(fd, addr, length)
        if not mine:
            ctypes.set_errno(errno.EADDRNOTAVAIL)
            return -1
        wanted = _sockaddr(host, raw[2:4])
        done = real(fd, wanted, len(wanted))
        if done != 0 and ctypes.get_errno() == errno.EADDRNOTAVAIL:
            fell_back.append(True)
            say(
                f"{host} is not an address of this machine: TensorFlow's server listens on "
                "every interface"
            )
            return real(fd, addr, length)
        return done

    return hooked


class _Dl(ctypes.Structure):
    _fields_ = [  # ctypes' own declaration
        ("addr", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("phdr", ctypes.c_void_p),
        ("phnum", ctypes.c_uint16),
    ]


def _objects() -> list[tuple[int, str, int, int]]:
    """(base, path, program headers, their count) of every object loaded in this process."""
    found: list[tuple[int, str, int, int]] = []
    visit = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Dl), ctypes.c_size_t, ctypes.c_void_p)

    def each(info: ctypes._Pointer[_Dl], size: int, data: int | None) -> int:
        dl = info.contents
        found.append((dl.addr, (dl.name or b"").decode(errors="replace"), dl.phdr, dl.phnum))
        return 0

    libc = ctypes.CDLL(None)
    libc.dl_iterate_phdr(visit(each), None)
    return found


def _dynamic(base: int, phdr: int, phnum: int) -> dict[int, int]:
    """The object's dynamic section as {tag: value} (addresses made absolute)."""
    is64 = ctypes.sizeof(ctypes.c_void_p) == 8
    size = 56 if is64 else 32
    for i in range(phnum):
        header = phdr + i * size
        if ctypes.c_uint32.from_address(header).value != _PT_DYNAMIC:
            continue
        vaddr = ctypes.c_size_t.from_address(header + (16 if is64 else 8)).value
        entries: dict[int, int] = {}
        at = base + vaddr
        word = ctypes.sizeof(ctypes.c_size_t)
        while True:
            tag = ctypes.c_ssize_t.from_address(at).value
            if tag == _DT_NULL:
                break
            entries.setdefault(tag, ctypes.c_size_t.from_address(at + word).value)
            at += 2 * word
        for tag in (_DT_STRTAB, _DT_SYMTAB, _DT_RELA, _DT_JMPREL, _DT_GNU_HASH, _DT_HASH):
            if tag in entries and entries[tag] < base:  # glibc relocates them in place; musl not
                entries[tag] += base
        return entries
    return {}


def _imports(dyn: dict[int, int]) -> int:
    """How many entries of the dynamic symbol table may be imports (all of them, with no GNU
    hash table to say where the defined ones start)."""
    if _DT_GNU_HASH in dyn:
        return ctypes.c_uint32.from_address(dyn[_DT_GNU_HASH] + 4).value  # symoffset
    if _DT_HASH in dyn:
        return ctypes.c_uint32.from_address(dyn[_DT_HASH] + 4).value  # nchain
    return 0


def _slots(base: int, dyn: dict[int, int], name: bytes) -> list[int]:
    """The addresses of the object's GOT slots that the dynamic linker fills with `name`."""
    if ctypes.sizeof(ctypes.c_void_p) != 8 or not {_DT_SYMTAB, _DT_STRTAB, _DT_STRSZ} <= set(dyn):
        return []
    count, strsz = _imports(dyn), dyn[_DT_STRSZ]
    symbols = ctypes.string_at(dyn[_DT_SYMTAB], 24 * count)  # Elf64_Sym: 24 bytes
    strings = memoryview((ctypes.c_char * strsz).from_address(dyn[_DT_STRTAB])).cast("B")
    wanted = name + b"\0"
    indices = [
        i
        for i, (at,) in enumerate(struct.iter_unpack("<I20x", symbols))
        if i and strings[at : at + len(wanted)] == wanted
    ]
    slots = []
    for table, size in ((_DT_JMPREL, _DT_PLTRELSZ), (_DT_RELA, _DT_RELASZ)):
        if table not in dyn or not indices:
            continue
        relocs = ctypes.string_at(dyn[table], dyn.get(size, 0))  # Elf64_Rela: 24 bytes
        for index in indices:
            for kind in _POINTER_RELOCS[table]:
                key = (index << 32 | kind).to_bytes(8, "little")  # r_info
                at = relocs.find(key)
                while at >= 0:
                    if at % 24 == 8:
                        slots.append(base + int.from_bytes(relocs[at - 8 : at], "little"))
                    at = relocs.find(key, at + 1)
    return slots


def _writable(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                return "w" in perms
    return False


def redirect_bind(folder: Path, host: str) -> int:
    """Point the ``bind`` of every loaded library under `folder` at `bind_to` `host`; how many
    slots were changed. Linux (ELF, 64-bit) only; elsewhere none."""
    if not hasattr(ctypes.CDLL(None), "dl_iterate_phdr"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    real = libc.bind
    real.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
    real.restype = ctypes.c_int
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    hook = _BIND(bind_to(host, real))
    _hooks.append(hook)
    target = ctypes.cast(hook, ctypes.c_void_p).value
    changed = 0
    root = str(folder.resolve()) + os.sep
    for base, path, phdr, phnum in _objects():
        if not path or not os.path.realpath(path).startswith(root):
            continue
        for slot in _slots(base, _dynamic(base, phdr, phnum), b"bind"):
            page = slot - slot % _PAGE
            locked = not _writable(slot)
            if locked and libc.mprotect(page, _PAGE, 3) != 0:  # PROT_READ | PROT_WRITE
                continue
            ctypes.c_void_p.from_address(slot).value = target
            if locked:
                libc.mprotect(page, _PAGE, 1)  # PROT_READ, as RELRO left it
            changed += 1
    return changed


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then` once `name` has been imported (its module executed), then goes away."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def create_module(
                self, spec: importlib.machinery.ModuleSpec
            ) -> types.ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: types.ModuleType) -> None:
                loader.exec_module(module)
                then(module)

        spec.loader = Loader()
        return spec


def _protect(module: types.ModuleType) -> None:
    host = own_host(os.environ.get("TF_CONFIG"))
    if host is None:  # one worker: MultiWorkerMirroredStrategy starts no server
        return
    folder = Path(module.__file__ or "").parent
    if redirect_bind(folder, host) == 0:
        say(
            f"cannot make TensorFlow's server listen on {host} alone here: it listens on "
            "every interface"
        )


def run(args: Sequence[str]) -> None:
    """Run `args` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) as Python would, TensorFlow's
    server bound to this worker's own address once the script imports it."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras: tf-keras's Keras 2
    sys.meta_path.insert(0, _AfterImport("tensorflow", _protect))
    if args[:1] == ["-m"]:
        sys.argv = list(args[1:])
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    path = os.path.abspath(args[0])
    sys.argv = list(args)
    sys.path[0] = os.path.dirname(path)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __builtins__=builtins,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", path),
    )
    sys.modules["__main__"] = main
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[:1] == ["-m"] and len(args) < 2):
        sys.exit("usage: python -m cloudtrain.node.tfworker SCRIPT ARGS... | -m MODULE ARGS...")
    run(args)


if __name__ == "__main__":  # under its own name, so that what it installs outlives the script's
    from cloudtrain.node import tfworker  # replacing ``__main__``

    tfworker.main()
