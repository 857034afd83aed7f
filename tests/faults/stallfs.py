"""A directory on a file server that can stall, as a Lustre or NFS server does: a tiny FUSE server,
spoken to over /dev/fuse with no library (as nolockfs.py), that passes every request through to the
directory it is mounted over. Stopping the server (SIGSTOP) freezes the directory for every process
that uses it: each read, write, create or rename waits in the kernel, unanswered, until SIGCONT,
exactly as a client waits on a server that stopped answering; nothing fails.

    python tests/faults/stallfs.py DIR -- COMMAND ...

mounts over DIR in a private mount namespace and runs COMMAND there; the server is this process
(freeze it with `kill -STOP`, thaw with `kill -CONT`). What COMMAND writes lands in DIR itself,
where every process outside the namespace sees it at once. Files open with direct I/O (no page
cache) and attributes are never cached, so that several mounts of one DIR (one per process tree)
stay coherent. Needs root (CAP_SYS_ADMIN) and /dev/fuse; `nolockfs.unavailable()` says why not.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import stat
import struct
import subprocess
import sys
import threading

from tests.faults.nolockfs import (
    ATTR,
    IN_HEADER,
    INIT_OUT,
    MNT_DETACH,
    OUT_HEADER,
    _check,
    _libc,
    private_namespace,
)

# FUSE opcodes (linux/fuse.h)
LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
MKNOD, MKDIR, UNLINK, RMDIR, RENAME = 8, 9, 10, 11, 12
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC, FLUSH, INIT = 14, 15, 16, 17, 18, 20, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS, CREATE = 27, 28, 29, 30, 34, 35
INTERRUPT, DESTROY, BATCH_FORGET, RENAME2 = 36, 38, 42, 45
NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)
ROOT = 1
FOPEN_DIRECT_IO = 1 << 0
FUSE_BIG_WRITES = 1 << 5
FATTR_MODE, FATTR_SIZE, FATTR_ATIME, FATTR_MTIME, FATTR_FH = 1, 8, 16, 32, 64
FATTR_ATIME_NOW, FATTR_MTIME_NOW = 128, 256
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")  # fuse_setattr_in
IO_IN = struct.Struct("<QQII")  # fh, offset, size, flags: the head of fuse_read_in / fuse_write_in
WRITE_IN_SIZE = 40


def _name(body: bytes, start: int = 0) -> tuple[str, int]:
    """A NUL-terminated name at `start` and the offset after it."""
    end = body.index(b"\0", start)
    return os.fsdecode(body[start:end]), end + 1


class PassFS:
    """Passes requests through to the directory `root_fd` (opened before the mount hid it)."""

    def __init__(self, root_fd: int):
        self.root = root_fd
        self.paths: dict[int, str] = {ROOT: "."}
        self.ids: dict[str, int] = {".": ROOT}

    def _path(self, parent: int, name: str) -> str:
        base = self.paths[parent]
        return name if base == "." else f"{base}/{name}"

    def _node(self, path: str) -> int:
        if path not in self.ids:
            self.ids[path] = len(self.paths) + 1
            self.paths[self.ids[path]] = path
        return self.ids[path]

    def _stat(self, path: str) -> os.stat_result:
        return os.stat(path, dir_fd=self.root, follow_symlinks=False)

    @staticmethod
    def _attr(st: os.stat_result) -> bytes:
        return ATTR.pack(
            st.st_ino,
            st.st_size,
            st.st_blocks,
            int(st.st_atime),
            int(st.st_mtime),
            int(st.st_ctime),
            st.st_atime_ns % 10**9,
            st.st_mtime_ns % 10**9,
            st.st_ctime_ns % 10**9,
            st.st_mode,
            st.st_nlink,
            st.st_uid,
            st.st_gid,
            st.st_rdev,
            4096,
            0,
        )

    def _attr_out(self, path: str) -> bytes:
        return struct.pack("<QII", 0, 0, 0) + self._attr(self._stat(path))  # valid 0 s: always asked

    def _entry(self, path: str) -> bytes:
        st = self._stat(path)
        return struct.pack("<QQQQII", self._node(path), 0, 0, 0, 0, 0) + self._attr(st)

    def _moved(self, old: str, new: str) -> None:
        for node, p in list(self.paths.items()):
            if p == old or p.startswith(old + "/"):
                self.ids.pop(p, None)
                q = new + p[len(old) :]
                self.paths[node] = q
                self.ids[q] = node

    def handle(self, opcode: int, nodeid: int, body: bytes) -> tuple[int, bytes]:
        """(errno, reply body) for one request; an OSError of the pass-through is its errno."""
        try:
            return 0, self._handle(opcode, nodeid, body)
        except OSError as e:
            return e.errno or errno.EIO, b""

    def _handle(self, opcode: int, nodeid: int, body: bytes) -> bytes:  # noqa: C901 - one branch per opcode
        if opcode == INIT:
            _, minor = struct.unpack_from("<II", body)
            return INIT_OUT.pack(7, min(minor, 31), 0, FUSE_BIG_WRITES, 16, 12, 128 * 1024, 1, 32, 0, 0, 0)
        path = self.paths.get(nodeid, ".")
        if opcode == LOOKUP:
            return self._entry(self._path(nodeid, _name(body)[0]))
        if opcode == GETATTR:
            return self._attr_out(path)
        if opcode == SETATTR:
            valid, _, fh, size, _, atime, mtime, _, atns, mtns, _, mode, *_ = SETATTR_IN.unpack_from(body)
            if valid & FATTR_MODE:
                os.chmod(path, stat.S_IMODE(mode), dir_fd=self.root)
            if valid & FATTR_SIZE:
                if valid & FATTR_FH:
                    os.ftruncate(fh, size)
                else:
                    fd = os.open(path, os.O_WRONLY, dir_fd=self.root)
                    try:
                        os.ftruncate(fd, size)
                    finally:
                        os.close(fd)
            if valid & (FATTR_ATIME | FATTR_MTIME):
                st = self._stat(path)
                now = None if valid & (FATTR_ATIME_NOW | FATTR_MTIME_NOW) else 0
                a = atime * 10**9 + atns if valid & FATTR_ATIME and now is not None else st.st_atime_ns
                m = mtime * 10**9 + mtns if valid & FATTR_MTIME and now is not None else st.st_mtime_ns
                os.utime(path, ns=(a, m), dir_fd=self.root, follow_symlinks=False)
            return self._attr_out(path)
        if opcode == MKDIR:
            mode, umask = struct.unpack_from("<II", body)
            new = self._path(nodeid, _name(body, 8)[0])
            os.mkdir(new, mode & ~umask, dir_fd=self.root)
            return self._entry(new)
        if opcode == MKNOD:
            mode, _, umask = struct.unpack_from("<III", body)
            new = self._path(nodeid, _name(body, 16)[0])
            if not stat.S_ISREG(mode):
                raise OSError(errno.EPERM, "regular files only")
            os.close(os.open(new, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode & ~umask & 0o7777, dir_fd=self.root))
            return self._entry(new)
        if opcode in (UNLINK, RMDIR):
            gone = self._path(nodeid, _name(body)[0])
            os.rmdir(gone, dir_fd=self.root) if opcode == RMDIR else os.unlink(gone, dir_fd=self.root)
            return b""
        if opcode in (RENAME, RENAME2):
            (newdir,) = struct.unpack_from("<Q", body)
            old, i = _name(body, 16 if opcode == RENAME2 else 8)
            new, _ = _name(body, i)
            if opcode == RENAME2 and struct.unpack_from("<I", body, 8)[0]:
                raise OSError(errno.EINVAL, "rename flags")  # RENAME_NOREPLACE/EXCHANGE: callers fall back
            src, dst = self._path(nodeid, old), self._path(newdir, new)
            os.rename(src, dst, src_dir_fd=self.root, dst_dir_fd=self.root)
            self._moved(src, dst)
            return b""
        if opcode in (OPEN, OPENDIR):
            (flags,) = struct.unpack_from("<I", body)
            if opcode == OPENDIR:
                return struct.pack("<QII", 0, 0, 0)
            fd = os.open(path, flags & ~(os.O_CREAT | os.O_EXCL | os.O_NOCTTY), dir_fd=self.root)
            return struct.pack("<QII", fd, FOPEN_DIRECT_IO, 0)
        if opcode == CREATE:
            flags, mode, umask, _ = struct.unpack_from("<IIII", body)
            new = self._path(nodeid, _name(body, 16)[0])
            fd = os.open(new, flags | os.O_CREAT, mode & ~umask & 0o7777, dir_fd=self.root)
            return self._entry(new) + struct.pack("<QII", fd, FOPEN_DIRECT_IO, 0)
        if opcode == READ:
            fh, offset, size, _ = IO_IN.unpack_from(body)
            return os.pread(fh, size, offset)
        if opcode == WRITE:
            fh, offset, size, _ = IO_IN.unpack_from(body)
            n = os.pwrite(fh, body[WRITE_IN_SIZE : WRITE_IN_SIZE + size], offset)
            return struct.pack("<II", n, 0)
        if opcode == READDIR:
            _, offset, size, _ = IO_IN.unpack_from(body)
            out = b""
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root)
            try:
                names = [".", "..", *sorted(os.listdir(dfd))]
            finally:
                os.close(dfd)
            for i, name in enumerate(names[offset:], start=offset + 1):
                raw = os.fsencode(name)
                ent = struct.pack("<QQII", 1, i, len(raw), 0) + raw
                ent += b"\0" * (-len(ent) % 8)
                if len(out) + len(ent) > size:
                    break
                out += ent
            return out
        if opcode == RELEASE:
            (fh,) = struct.unpack_from("<Q", body)
            os.close(fh)
            return b""
        if opcode == FSYNC:
            (fh,) = struct.unpack_from("<Q", body)
            os.fsync(fh)
            return b""
        if opcode in (FLUSH, RELEASEDIR, FSYNCDIR, ACCESS, DESTROY):
            return b""
        if opcode == STATFS:
            s = os.statvfs(self.root)
            return struct.pack(
                "<QQQQQIIII24x", s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize, 255, s.f_frsize, 0
            )
        raise OSError(errno.ENOSYS, "not served")

    def serve(self, fd: int) -> None:
        """Answer requests until the file system is unmounted (ENODEV)."""
        while True:
            try:
                req = os.read(fd, 1 << 20)
            except OSError as e:
                if e.errno in (errno.EINTR, errno.ENOENT):  # ENOENT: an interrupted request
                    continue
                return
            _, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(req)
            if opcode in NO_REPLY:
                continue
            err, out = self.handle(opcode, nodeid, req[IN_HEADER.size :])
            if err:
                out = b""
            with contextlib.suppress(OSError):  # the request was interrupted meanwhile
                os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(out), -err, unique) + out)


def mount(path: str) -> threading.Thread:
    """Mount a pass-through of the directory `path` over itself; returns the serving thread."""
    root = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode={stat.S_IFDIR:o},user_id={os.getuid()},group_id={os.getgid()},allow_other"
    _check(_libc().mount(b"stallfs", path.encode(), b"fuse.stallfs", 0, opts.encode()), f"mount on {path}")
    t = threading.Thread(target=PassFS(root).serve, args=(fd,), daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    path = os.path.abspath(a.dir)
    os.makedirs(path, exist_ok=True)
    private_namespace()
    mount(path)
    try:
        return subprocess.run(cmd).returncode
    finally:
        _libc().umount2(path.encode(), MNT_DETACH)


if __name__ == "__main__":
    sys.exit(main())
