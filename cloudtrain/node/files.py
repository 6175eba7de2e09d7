"""Files on a node that no rsync or SSH reaches: a Slurm node (each the one task of a step,
`cloudtrain.providers.slurm._executor`) or a Kubernetes pod (through the API's exec). Standard
library only: it runs as ``python -c SOURCE VERB …`` (`source()`, this file's text) before
anything is installed.

    files          write the files of the JSON object on stdin, each atomically and the user's
                   alone, unless the one it names as ``unless`` exists (the bootstrap's)
    unpack DEST    make DEST what the tar on stdin holds under ``data``: only what changed is
                   replaced, in place (a running job's folder stays its folder), what it does
                   not name is removed
    pack SRC       SRC's regular files and folders as a tar on stdout: no link, no hard link,
                   no save in progress; exit 3 when SRC is no folder

``unpack`` and ``pack`` carry a folder's files both ways (on Slurm, where the node does not
share the login node's folder). What
``pack`` sends is checked again where it arrives (`cloudtrain.executors.received.untar`): the
node may lie.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
import sys
import tarfile
import tempfile

#: What `pack` leaves out: a save being written (`cloudtrain.executors.received.IN_PROGRESS`).
IN_PROGRESS = ("*.tmp", "*.cloudtrain-tmp")


def source() -> str:
    """This program's text, for ``python -c`` (the controller's; no node imports it)."""
    with open(__file__) as f:
        return f.read()


def files() -> None:
    """Write the files of the JSON object on stdin (``{"files": {PATH: TEXT}, "unless": PATH}``),
    each atomically and the user's alone, unless ``unless`` exists: then print ``exists``."""
    request = json.loads(sys.stdin.read())
    if request.get("unless") and os.path.exists(request["unless"]):
        print("exists")
        return
    os.umask(0o077)
    for path, text in request["files"].items():
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(f"{path}.tmp.{os.getpid()}", "w") as f:
            f.write(text)
        os.replace(f"{path}.tmp.{os.getpid()}", path)
    print("written")


def unpack(dest: str) -> None:
    """Make `dest` what the tar on stdin holds under ``data`` (a file, or a folder): only what
    changed is replaced, in place, and what it does not name is removed."""
    os.umask(0o077)
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".unpack-") as tmp:
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extraction_filter = tarfile.data_filter
            tar.extractall(tmp)
        data = os.path.join(tmp, "data")
        if not os.path.isdir(data):
            if os.path.isdir(dest) and not os.path.islink(dest):
                shutil.rmtree(dest)
            os.replace(data, dest)
            return
        if os.path.islink(dest) or (os.path.exists(dest) and not os.path.isdir(dest)):
            os.unlink(dest)
        os.makedirs(dest, mode=0o700, exist_ok=True)
        wanted = set()
        for top, folders, names in os.walk(data):
            rel = os.path.relpath(top, data)
            for name in folders + names:
                wanted.add(os.path.normpath(os.path.join(rel, name)))
                old, new = os.path.join(dest, rel, name), os.path.join(top, name)
                if os.path.isdir(new) and not os.path.islink(new):
                    if os.path.islink(old) or (os.path.exists(old) and not os.path.isdir(old)):
                        os.unlink(old)
                    os.makedirs(old, mode=0o700, exist_ok=True)
                    continue
                if os.path.isdir(old) and not os.path.islink(old):
                    shutil.rmtree(old)
                os.replace(new, old)
        for top, folders, names in os.walk(dest, topdown=False):
            for name in folders + names:
                path = os.path.join(top, name)
                if os.path.normpath(os.path.relpath(path, dest)) in wanted:
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)


def pack(src: str) -> int:
    """Write `src`'s regular files and folders to stdout as a tar; 3 when it is no folder."""
    if not os.path.isdir(src) or os.path.islink(src):
        print(f"{src}: no folder", file=sys.stderr)
        return 3
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a link is refused, a fifo not waited on
    # PAX: a modification time finer than the second, which the copy's quick check compares
    # (a checkpoint saved again within the second, at the same size, is a new one)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for top, folders, names in os.walk(src):
            for name in sorted(folders + names):
                if any(fnmatch.fnmatch(name, p) for p in IN_PROGRESS):
                    continue
                path = os.path.join(top, name)
                try:  # gone meanwhile, or a link: left out
                    fd = os.open(path, flags)
                except OSError:
                    continue
                st = os.fstat(fd)
                info = tarfile.TarInfo(os.path.relpath(path, src))
                info.mtime, info.mode = st.st_mtime_ns / 1e9, stat.S_IMODE(st.st_mode)
                if not stat.S_ISREG(st.st_mode):
                    os.close(fd)
                    if stat.S_ISDIR(st.st_mode):
                        info.type = tarfile.DIRTYPE
                        tar.addfile(info)
                    continue
                with os.fdopen(fd, "rb") as f:  # never a hard link: each name its bytes
                    info.size = st.st_size
                    tar.addfile(info, f)  # cut short while it is sent: the pack fails
    return 0


if __name__ == "__main__":
    verb, args = sys.argv[1:2], sys.argv[2:]
    if verb == ["files"]:
        files()
    elif verb == ["unpack"] and len(args) == 1:
        unpack(args[0])
    elif verb == ["pack"] and len(args) == 1:
        sys.exit(pack(args[0]))
    else:
        sys.exit("usage: files | unpack DEST | pack SRC")
