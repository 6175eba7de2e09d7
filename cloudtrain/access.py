"""How the user reaches a cluster's nodes: its SSH key, and the address SSH is allowed from.

Each cluster gets its own ed25519 key pair under ``<home>/keys/<cluster>/`` (the private key
0600 in a 0700 folder); only the public half ever leaves this machine. SSH is opened to the
caller's public address (a /32), found by asking a "what is my IP" service, never to the whole
internet unless the user says so.

What the home holds is trusted only while no one else could have written it (`private_folder`,
`private_file`): the home, ``keys/``, a cluster's key folder and the caches must be this user's
and writable by no one else, and the key files this user's, or the command stops with one line
naming the path (a home that was once loose may hold another user's keys, whose host key would
go into a node's user-data).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cloudtrain.errors import AccountError, ConfigError

PUBLIC_IP_URL = "https://checkip.amazonaws.com"
WORLD = ("0.0.0.0/0", "::/0")


def cluster_key(home: Path, cluster: str) -> tuple[Path, str]:
    """The cluster's private key path and its public key line, made on first use. Idempotent.
    Raises `ConfigError` for a key (or a folder above it) another user could have written."""
    return _key_pair(key_folder(home, cluster), "id_ed25519", f"cloudtrain-{cluster}")


def host_key(home: Path, cluster: str) -> tuple[Path, str]:
    """The cluster's SSH **host** key (its nodes present it; cloud-init installs it), made on
    first use: the coordinator pins its public half in a per-cluster known_hosts."""
    folder = key_folder(home, cluster)
    return _key_pair(folder, "ssh_host_ed25519_key", f"cloudtrain-{cluster}-host")


def key_folder(home: Path, cluster: str) -> Path:
    """``<home>/keys/<cluster>``, made 0700; each folder on the way checked (`private_folder`)."""
    for folder in (home, home / "keys", home / "keys" / cluster):
        private_folder(folder, "cloudtrain's home" if folder == home else "key folder")
    return home / "keys" / cluster


def known_hosts(home: Path, cluster: str, addresses: list[str]) -> Path:
    """Write ``<home>/keys/<cluster>/known_hosts`` pinning the host key for `addresses`."""
    _, public = host_key(home, cluster)
    key_type, key_b64 = public.split()[:2]
    path = home / "keys" / cluster / "known_hosts"
    atomic_write(path, "".join(f"{a} {key_type} {key_b64}\n" for a in addresses), 0o600)
    return path


def ssh_options(home: Path, cluster: str) -> list[str]:
    """OpenSSH client options for the cluster's nodes: its own key only, its pinned host key
    only (``StrictHostKeyChecking=yes`` against its known_hosts: never trust on first use).
    Raises `ConfigError` when the key or the known_hosts could be another user's."""
    folder = key_folder(home, cluster)
    for name in ("id_ed25519", "known_hosts"):
        if (folder / name).exists():
            private_file(folder / name, "key file")
    options = client_options(folder / "id_ed25519", folder / "known_hosts")
    return [*options, "-o", "HostKeyAlgorithms=ssh-ed25519"]


#: A login name ssh and rsync cannot read as an option: POSIX's portable user name, at most 32.
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#: A host name (RFC 1123 labels, dot-separated, at most 253 characters).
HOSTNAME_RE = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")


def check_login(user: object, address: object, where: str) -> None:
    """Refuse a user that is not a user name, or an address that is neither an IP address nor
    a host name (`ConfigError` naming `where`): nothing that ssh or rsync could read as an
    option (``-oProxyCommand=...``) or as more than one argument reaches their command line."""
    if not isinstance(user, str) or not USER_RE.fullmatch(user):
        raise ConfigError(
            f"{where}: user {user!r} is not a user name (letters, digits, '.', '_', '-'; "
            "starting with a letter or '_'; at most 32)"
        )
    if not isinstance(address, str):
        raise ConfigError(f"{where}: address {address!r} is not an IP address or a host name")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if not HOSTNAME_RE.fullmatch(address):
            raise ConfigError(
                f"{where}: address {address!r} is not an IP address or a host name"
            ) from None


def parse_target(text: str, where: str, default_user: str | None = None) -> tuple[str, str, int]:
    """``user@address[:port]`` (an IPv6 address without the port) as (user, address, port),
    checked as `check_login` checks them; `ConfigError` naming `where` otherwise."""
    user, _, rest = text.strip().rpartition("@")
    user = user or (default_user or "")
    address, colon, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
    if not user or not (address or rest) or (colon and not port.isdigit()):
        raise ConfigError(f"{where} {text!r}: write user@address or user@address:port")
    number = int(port) if colon else 22
    if not 0 < number < 65536:
        raise ConfigError(f"{where} {text!r}: port {number} is not 1 to 65535")
    check_login(user, address or rest, f"{where} {text!r}")
    return user, address or rest, number


def jump_options(options: Sequence[str], jump: str, user: str, port: int = 22) -> list[str]:
    """Options that reach a node with no public address through one that has one (the head):
    ssh runs ``ssh <options> -W <node>:<port> user@jump`` as its ProxyCommand, so the hop uses
    the same key and the same pinned host keys. (``ProxyJump`` would not: options given on the
    command line do not apply to the jump host, whose key would then be checked against the
    user's own known_hosts.)"""
    check_login(user, jump, "jump host")
    inner = shlex.join(["ssh", *options, "-p", str(port), "-W", "%h:%p", "--", f"{user}@{jump}"])
    return ["-o", f"ProxyCommand={inner}"]


def client_options(identity: Path, known_hosts: Path) -> list[str]:
    """OpenSSH client options: this key only, host keys from this known_hosts only, strictly."""
    return [
        "-i", str(identity),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=10",
    ]  # fmt: skip


def _key_pair(folder: Path, name: str, comment: str) -> tuple[Path, str]:
    """The key pair ``folder/name`` (+ ``.pub``), made on first use. Safe when several
    processes make it at once: the private key is published with one atomic ``link(2)``
    (the first one wins, the others use it), and the public line is always derived from the
    private key that won, so every process hands out the same key.

    OpenSSH's ``ssh-keygen`` makes and reads the keys when it is on the PATH (the ssh client
    cloudtrain drives comes with it): a few milliseconds in a process of its own, where the
    ``cryptography`` package costs `up` a tenth of a second of imports; without it, that
    package does the same."""
    private = folder / name
    public = folder / f"{name}.pub"
    if private.exists() and public.exists():
        private_file(private, "key file")
        private_file(public, "key file")
        return private, public.read_text().strip()
    keygen = shutil.which("ssh-keygen")
    mine = _publish_private(folder, private, keygen) if not private.exists() else None
    public_line = f"{mine or _public_of(private, keygen)} {comment}"
    atomic_write(public, public_line + "\n", 0o644)
    return private, public_line


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        raise ConfigError(
            "making SSH keys needs ssh-keygen (OpenSSH) or the cryptography package: pip "
            "install 'cloudtrain[aws]'"
        ) from None
    return serialization


def _keygen(keygen: str, *args: str) -> str:
    """``ssh-keygen ARGS``' output; its error is a `ConfigError` (a key it cannot make)."""
    done = subprocess.run(
        [keygen, *args],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ConfigError(f"ssh-keygen could not make or read a key: {why}")
    return done.stdout


def _public_of(private: Path, keygen: str | None) -> str:
    """The OpenSSH public line (type and key, no comment) of the key at `private`."""
    if keygen:
        return " ".join(_keygen(keygen, "-y", "-f", str(private)).split()[:2])
    serialization = _crypto()
    key = serialization.load_ssh_private_key(private.read_bytes(), password=None)
    line = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return str(line.decode())


def _publish_private(folder: Path, private: Path, keygen: str | None) -> str | None:
    """Make a key and publish it as `private` unless another process's is there first; the
    public line of the one made when it won (None when it lost: read the winner's)."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{private.name}.") as tmp:
        made = Path(tmp) / private.name  # 0600, in a 0700 folder of this process's own
        if keygen:
            _keygen(keygen, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(made))
            public: str | None = " ".join(Path(f"{made}.pub").read_text().split()[:2])
        else:
            serialization = _crypto()
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            pem = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
            fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            public = None  # read back from the winner
        try:
            os.link(made, private)
        except FileExistsError:  # another process's key won: use it
            return None
        return public


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _untrusted(path: Path, found: os.stat_result) -> str | None:
    """Why `path` (as `found`) may hold what another user wrote, or None."""
    if found.st_uid != os.getuid():
        return f"is owned by {_who(found.st_uid)}, not by you ({_who(os.getuid())})"
    if stat.S_IMODE(found.st_mode) & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(found.st_mode):04o})"
    return None


def private_folder(path: Path, what: str, *, tighten: bool = True) -> Path:
    """`path`, a folder only this user can write: made 0700 when absent (parents too), a looser
    one that others could only read tightened to 0700 (unless not `tighten`). Raises
    `ConfigError` (one line naming the path) when it is another user's, or writable by others:
    what is in it may have been put there by someone else (keys whose private half they know,
    a cache they made), and is not used. A symlink counts as the folder it names, and must be
    this user's too. `OSError` when it cannot be made."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)  # OSError: it cannot be made
    link = os.lstat(path)
    found = os.stat(path)
    why = _untrusted(path, link) if stat.S_ISLNK(link.st_mode) else None
    why = why or (None if stat.S_ISDIR(found.st_mode) else "is not a folder")
    why = why or _untrusted(path, found)
    if why:
        raise ConfigError(
            f"{what} {path} {why}: another user could have put what it holds there; check "
            "it, then remove it or make it yours alone (chmod 700), or set CLOUDTRAIN_HOME "
            "to a folder of your own"
        )
    if tighten and stat.S_IMODE(found.st_mode) & 0o077:
        path.chmod(0o700)
    return path


def private_file(path: Path, what: str) -> None:
    """Raise `ConfigError` (one line naming the path) unless `path` is a regular file (not a
    link) of this user's that no one else can write, nor read when it is a private key."""
    found = os.lstat(path)
    why = None if stat.S_ISREG(found.st_mode) else "is not a regular file"
    why = why or _untrusted(path, found)
    secret = not path.name.endswith(".pub") and path.name != "known_hosts"
    if not why and secret and stat.S_IMODE(found.st_mode) & 0o077:
        why = f"is readable by other users (mode {stat.S_IMODE(found.st_mode):04o})"
    if why:
        raise ConfigError(
            f"{what} {path} {why}: it may not be the key cloudtrain made; remove it (`down` "
            "the cluster first if it is up), or make it yours alone"
        )


def atomic_write(path: Path, text: str | bytes, mode: int) -> None:
    """Write `path` whole or not at all (a temp file renamed over it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def forget_key(home: Path, cluster: str) -> None:
    """Delete the cluster's key pair from this machine (after `down`)."""
    folder = home / "keys" / cluster
    for name in ("id_ed25519", "ssh_host_ed25519_key", "known_hosts"):
        (folder / name).unlink(missing_ok=True)
        (folder / f"{name}.pub").unlink(missing_ok=True)
    if folder.exists() and not any(folder.iterdir()):
        folder.rmdir()


def is_loopback(host: str) -> bool:
    """True for an address (or ``localhost``) on this machine's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def local_endpoint(endpoint: str | None) -> bool:
    """True when a cloud API `endpoint` is on this machine (a test stand-in): the node
    addresses it hands out are invented (moto's 54.x belong to strangers), so the provider
    makes SSH to them refuse to connect (`SshExecutor.loopback_only`)."""
    host = urllib.parse.urlsplit(endpoint or "").hostname
    return bool(host) and is_loopback(str(host))


def validate_cidr(value: str, field: str = "--ssh-cidr") -> str:
    """A network in CIDR form (a bare address becomes a /32 or /128)."""
    try:
        return str(ipaddress.ip_network(value.strip(), strict=False))
    except ValueError:
        raise ConfigError(
            f"{field} {value!r} is not an address or network; write e.g. 203.0.113.7/32"
        ) from None


def caller_cidr(url: str | None = None, timeout_s: float = 3.0) -> str | None:
    """This machine's public address as a /32 (or /128), or None when it cannot be found.
    `url` (default ``$CLOUDTRAIN_PUBLIC_IP_URL`` or checkip.amazonaws.com) answers with the
    address as plain text."""
    import urllib.request  # here: every `up` imports this module, few ask the address

    url = url or os.environ.get("CLOUDTRAIN_PUBLIC_IP_URL") or PUBLIC_IP_URL
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read(64).decode().strip()
        address = ipaddress.ip_address(text)
    except (OSError, ValueError):
        return None
    return f"{address}/{address.max_prefixlen}"


def ssh_cidr(requested: str | None) -> tuple[str, bool]:
    """The CIDR SSH is opened to, and whether it is the whole internet. Raises `ConfigError`
    when none was given and this machine's public address cannot be found."""
    if requested:
        cidr = validate_cidr(requested)
        return cidr, cidr in WORLD
    found = caller_cidr()
    if found is None:
        raise AccountError(
            "cannot find this machine's public address to allow SSH from; pass --ssh-cidr "
            "(e.g. --ssh-cidr 203.0.113.7/32, or your VPN's range)"
        )
    return found, False
