"""A file system that refuses POSIX locks, as Lustre mounted `noflock` (ENOSYS) or NFS without
lockd (ENOLCK) do: a tiny FUSE server, spoken to over /dev/fuse with no library, that serves ONE
regular file (FUSE mounts on a file as well as on a directory) and answers every lock request
with a chosen errno.

It advertises FUSE_POSIX_LOCKS, so the kernel forwards `lockf`/`fcntl` locks to it instead of
keeping them locally, exactly where a network file system's client asks its lock server. The
file's bytes live in memory; reads, writes and truncation work, so a program using the file sees
an ordinary file except for its locks.

    python tests/faults/nolockfs.py --errno ENOLCK FILE -- COMMAND ...

mounts over FILE (created if missing) in a private mount namespace, runs COMMAND there, copies
what was written through the mount back into FILE, and exits with COMMAND's status: nothing is
mounted outside this process tree, even if it is killed.
Needs root (CAP_SYS_ADMIN) and /dev/fuse; `unavailable()` says why not.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import functools
import os
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE, MNT_DETACH = 0x4000, 1 << 18, 2
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # fuse_init_out, 64 bytes
FUSE_POSIX_LOCKS = 1 << 1
FOPEN_DIRECT_IO = 1 << 0
FATTR_SIZE = 1 << 3
(
    LOOKUP,
    FORGET,
    GETATTR,
    SETATTR,
    OPEN,
    READ,
    WRITE,
    RELEASE,
    FSYNC,
    FLUSH,
    INIT,
    GETLK,
    SETLK,
    SETLKW,
    ACCESS,
    INTERRUPT,
    DESTROY,
    BATCH_FORGET,
) = (1, 2, 3, 4, 14, 15, 16, 18, 20, 25, 26, 31, 32, 33, 34, 36, 38, 42)
NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)
ROOT = 1


@functools.cache
def unavailable() -> str | None:
    """Why this machine cannot mount it (None: it can), found by mounting it once."""
    if os.geteuid() != 0:
        return "needs root to mount a FUSE file system"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(
            [sys.executable, __file__, os.path.join(d, "probe"), "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    return None if r.returncode == 0 else f"cannot mount a FUSE file system here: {r.stderr.strip()[-300:]}"


class NoLockFS:
    """Serves one in-memory regular file; every lock request fails with `lock_errno`."""

    def __init__(self, lock_errno: int, data: bytes = b""):
        self.lock_errno = lock_errno
        self.data = bytearray(data)
        self.mtime = time.time()
        self.lock_requests = 0

    def attr(self) -> bytes:
        t = int(self.mtime)
        return ATTR.pack(
            ROOT,
            len(self.data),
            (len(self.data) + 511) // 512,
            t,
            t,
            t,
            0,
            0,
            0,
            stat.S_IFREG | 0o644,
            1,
            os.getuid(),
            os.getgid(),
            0,
            4096,
            0,
        )

    def attr_out(self) -> bytes:
        return struct.pack("<QII", 0, 0, 0) + self.attr()  # attr_valid 0: the kernel always asks

    def handle(self, opcode: int, body: bytes) -> tuple[int, bytes]:
        """(errno, reply body) for one request."""
        if opcode == INIT:
            major, minor = struct.unpack_from("<II", body)
            return 0, INIT_OUT.pack(7, min(minor, 31), 0, FUSE_POSIX_LOCKS, 16, 12, 128 * 1024, 1, 32, 0, 0, 0)
        if opcode == GETATTR:
            return 0, self.attr_out()
        if opcode == SETATTR:
            valid, _, _, size = struct.unpack_from("<IIQQ", body)
            if valid & FATTR_SIZE:
                del self.data[size:]
                self.data.extend(b"\0" * (size - len(self.data)))
                self.mtime = time.time()
            return 0, self.attr_out()
        if opcode == OPEN:
            return 0, struct.pack("<QIi", 1, FOPEN_DIRECT_IO, 0)
        if opcode == READ:
            _, offset, size = struct.unpack_from("<QQI", body)
            return 0, bytes(self.data[offset : offset + size])
        if opcode == WRITE:
            _, offset, size = struct.unpack_from("<QQI", body)
            chunk = body[40 : 40 + size]
            self.data.extend(b"\0" * max(0, offset - len(self.data)))
            self.data[offset : offset + len(chunk)] = chunk
            self.mtime = time.time()
            return 0, struct.pack("<II", len(chunk), 0)
        if opcode in (GETLK, SETLK, SETLKW):
            self.lock_requests += 1
            return self.lock_errno, b""
        if opcode in (RELEASE, FLUSH, FSYNC, ACCESS, DESTROY):
            return 0, b""
        if opcode == LOOKUP:
            return errno.ENOENT, b""  # the root is a file: nothing below it
        return errno.ENOSYS, b""

    def serve(self, fd: int) -> None:
        """Answer requests until the file system is unmounted (ENODEV)."""
        while True:
            try:
                req = os.read(fd, 1 << 20)
            except OSError as e:
                if e.errno == errno.EINTR or e.errno == errno.ENOENT:  # ENOENT: an interrupted request
                    continue
                return
            _, opcode, unique, *_ = IN_HEADER.unpack_from(req)
            if opcode in NO_REPLY:
                continue
            err, out = self.handle(opcode, req[IN_HEADER.size :])
            if err:
                out = b""
            with contextlib.suppress(OSError):  # OSError: the request was interrupted meanwhile
                os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(out), -err, unique) + out)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def private_namespace() -> None:
    """Mounts made after this are seen by this process and its children only."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")


def mount(fs: NoLockFS, path: str) -> threading.Thread:
    """Mount `fs` over the regular file `path`; returns the serving thread."""
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode={stat.S_IFREG:o},user_id={os.getuid()},group_id={os.getgid()}"
    _check(_libc().mount(b"nolockfs", path.encode(), b"fuse.nolockfs", 0, opts.encode()), f"mount on {path}")
    t = threading.Thread(target=fs.serve, args=(fd,), daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--errno", default="ENOLCK", help="what every lock request gets (ENOLCK, ENOSYS, EOPNOTSUPP)")
    p.add_argument("file")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    path = os.path.abspath(a.file)
    if not os.path.exists(path):
        open(path, "a").close()
    with open(path, "rb") as f:
        data = f.read()
    private_namespace()
    fs = NoLockFS(getattr(errno, a.errno), data)
    mount(fs, path)
    try:
        rc = subprocess.run(cmd).returncode
    finally:
        _libc().umount2(path.encode(), MNT_DETACH)
    with open(path, "wb") as f:  # what was written through the mount, for the caller to read
        f.write(fs.data)
    print(f"nolockfs: {fs.lock_requests} lock request(s) refused with {a.errno}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
