"""Ordinary users of the Slurm test cluster, as a shared site has them (docs/sweeps.md, "Users of the
test cluster").

A real cluster is hundreds of ordinary uids in groups; project trees are group-writable and setgid
(2775) and users work with `umask 002`; their login shells do not export what this machine does
(`PYTHONDONTWRITEBYTECODE=1`, `PYTHONUNBUFFERED=1`, CI's variables). `SiteUsers.make` creates two
such users in one group, each with a home of their own, and a project tree; `command` turns a command
into the one a user's login shell would run (their uid, groups, umask and a clean environment:
`login_env`). A Slurm job that user submits runs as them (slurmd starts jobs as their submitter).

What they need of this machine's root-owned set-up is made reachable, not readable: the directories
above this Python's prefix and the checkout (`/root` is 0700 here) get the search bit for others
(`reach`), restored by `remove`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
# How a user's hpctrain is found: the checkout's sources on PYTHONPATH (a user's `pip install --user`
# of the wheel puts the same package on their path; the tests run this checkout's code).
USER_PYTHONPATH = os.pathsep.join([str(CHECKOUT / "src"), str(CHECKOUT)])
LOGIN_PATH = "/usr/local/bin:/usr/bin:/bin"
PROJECT_MODE = 0o2775  # a group project tree: group-writable, setgid (new files keep the group)
USER_UMASK = 0o002
# the directories `reach` opened, their modes before, and the test processes that need them
REACH_STATE = Path("/tmp/hpctrain-test-reach.json")


@contextlib.contextmanager
def _reach_state():
    """REACH_STATE, read and written back under an exclusive lock."""
    with open(f"{REACH_STATE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(REACH_STATE.read_text())
        except (OSError, ValueError):
            state = {"modes": {}, "holders": []}
        yield state
        tmp = REACH_STATE.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(REACH_STATE)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path
    umask: int = USER_UMASK  # a shared site's group umask


@dataclass
class SiteUsers:
    base: Path  # world-traversable (0755): homes/ and project/ below
    group: str
    gid: int
    users: tuple[User, ...]

    @property
    def project(self) -> Path:
        return self.base / "project"

    @classmethod
    def make(cls, count: int = 2) -> SiteUsers:
        """`count` users of a new group, homes 0700 each, a project tree 2775 of the group."""
        tag = secrets.token_hex(3)
        group = f"hpcproj{tag}"
        base = Path(tempfile.mkdtemp(prefix="hpctrain-site-", dir="/tmp"))
        base.chmod(0o755)
        subprocess.run(["groupadd", group], check=True, capture_output=True)
        gid = int(
            subprocess.run(["getent", "group", group], check=True, capture_output=True, text=True).stdout.split(":")[2]
        )
        site = cls(base, group, gid, ())
        (base / "homes").mkdir(mode=0o755)
        users = []
        try:
            for c in "abcdefgh"[:count]:
                name, home = f"hpcu{c}{tag}", base / "homes" / f"u{c}"
                subprocess.run(
                    ["useradd", "-M", "-N", "-g", group, "-d", str(home), "-s", "/bin/bash", name],
                    check=True,
                    capture_output=True,
                )
                uid = int(subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout)
                home.mkdir(mode=0o700)
                os.chown(home, uid, gid)
                users.append(User(name, uid, gid, home))
                site.users = tuple(users)
            site.project.mkdir()
            os.chown(site.project, 0, gid)
            site.project.chmod(PROJECT_MODE)
            site.reach(Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent, CHECKOUT)
        except BaseException:
            site.remove()
            raise
        return site

    def reach(self, *paths: Path) -> None:
        """Give others the search bit on `paths` and the directories above them (not the read bit:
        nothing is listed), so that a user can reach what is below. Several test processes share these
        directories (xdist workers, a second session): the modes before are kept in REACH_STATE with
        the processes that need them, and `remove` puts them back when the last one leaves."""
        with _reach_state() as state:
            for p in paths:
                p = Path(os.path.realpath(p))
                for d in [p, *p.parents]:
                    if not d.is_dir():
                        continue
                    mode = stat.S_IMODE(d.stat().st_mode)
                    if not mode & stat.S_IXOTH:
                        state["modes"].setdefault(str(d), mode)
                        d.chmod(mode | stat.S_IXOTH)
            state["holders"] = sorted({*state["holders"], os.getpid()})

    def share(self, d: Path) -> None:
        """Make `d` (a test's own directory) part of the project tree: the group's, 2775."""
        os.chown(d, -1, self.gid)
        d.chmod(PROJECT_MODE)

    def remove(self) -> None:
        """Delete the users and the group, put back the modes `reach` changed, remove `base`."""
        for u in self.users:
            subprocess.run(["userdel", u.name], capture_output=True)
        subprocess.run(["groupdel", self.group], capture_output=True)
        with _reach_state() as state:
            state["holders"] = [h for h in state["holders"] if h != os.getpid() and alive(h)]
            if not state["holders"]:  # the last process that needed them
                for d, mode in state["modes"].items():
                    with contextlib.suppress(OSError):
                        Path(d).chmod(mode)
                state["modes"] = {}
        shutil.rmtree(self.base, ignore_errors=True)

    def command(self, user: User, cmd: list[str], wrap: list[str] | None = None) -> list[str]:
        """`cmd` as `user` runs it from a login shell: their uid, group and supplementary groups,
        their umask. `wrap` runs first as root (the 24.11 cluster's chroot: `bin/enter`)."""
        return [
            *(wrap or []),
            "setpriv",
            f"--reuid={user.uid}",
            f"--regid={user.gid}",
            "--init-groups",
            "--",
            "/bin/bash",
            "-c",
            f'umask {user.umask:03o} && exec "$@"',
            "login",
            *cmd,
        ]


def login_env(user: User, site: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of `user`'s login shell: no variable of this machine or of the test run
    (PYTHONDONTWRITEBYTECODE, PYTHONUNBUFFERED, CI, …), their own HOME and PATH, hpctrain on their
    Python path; `site` adds what the site's shell profile sets (SLURM_CONF, a module path, …)."""
    return {
        "HOME": str(user.home),
        "USER": user.name,
        "LOGNAME": user.name,
        "SHELL": "/bin/bash",
        "PATH": LOGIN_PATH,
        "LANG": "C.UTF-8",
        "PYTHONPATH": USER_PYTHONPATH,
        # the checkout is root's here, a user's own on a site: git reads its commit for them all the same
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": str(CHECKOUT),
        **(site or {}),
    }
