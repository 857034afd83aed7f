"""Test-wide set-up: import this checkout's sources (also in subprocesses and Slurm jobs)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.site_users import alive

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))
# ROOT too: helper scripts run as `python -m tests.…` from each test's own directory (checkout_guard)
os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
# Bitwise comparisons on CPU need a fixed thread count (CONTRIBUTING.md, "Test tiers").
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Fake sysfs trees of real nodes: fixtures for the doctor and the `cluster init --probe` tests; the
# checkout guard: a test that writes into the checkout fails (tests/checkout_guard.py); the time each
# xdist worker was busy, after --durations (tests/worker_load.py).
pytest_plugins = ["tests.doctor.fake_sysfs", "tests.checkout_guard", "tests.worker_load"]


# The session's temp directories live under a root of its own, not /tmp/pytest-of-<user>: every pytest
# session that starts on the machine (a fast tier run beside CI, another project's tests) takes the
# others' bits off that directory (pytest does, for privacy), and the Slurm tests' ordinary users then
# lose their way into a running job's directory mid-run (EACCES on metrics.jsonl, checkpoints: issue 56).
SESSION_ROOT_PREFIX = "hpctrain-pytest-"
SESSION_ROOTS_KEPT = 3  # the newest roots of ended sessions stay for a look, as pytest keeps 3 basetemps


def _session_ended(root: Path) -> bool:
    """Whether the session that made `root` (named PREFIX<pid>-<random>) has ended."""
    head = root.name[len(SESSION_ROOT_PREFIX) :].split("-", 1)[0]
    return not (head.isdigit() and int(head) > 0 and alive(int(head)))


@pytest.hookimpl(tryfirst=True)  # before the tmpdir plugin reads --basetemp
def pytest_configure(config):
    """A root of the session's own for its temp directories, unless --basetemp says where (an xdist
    worker is given its part of the main process's); the roots of ended sessions beyond the newest
    SESSION_ROOTS_KEPT are removed."""
    if hasattr(config, "workerinput") or config.option.basetemp is not None:
        return
    tmp = Path(tempfile.gettempdir())
    ended = [d for d in tmp.glob(f"{SESSION_ROOT_PREFIX}*") if _session_ended(d)]
    for old in sorted(ended, key=lambda d: d.stat().st_mtime if d.exists() else 0)[:-SESSION_ROOTS_KEPT]:
        shutil.rmtree(old, ignore_errors=True)
    root = Path(tempfile.mkdtemp(prefix=f"{SESSION_ROOT_PREFIX}{os.getpid()}-", dir=tmp))
    config.option.basetemp = str(root / "base")


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return bool(info) and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """How xdist (`--dist loadgroup`) shares the tests between its workers:

    - every test on the Slurm cluster runs in one worker: one cluster per session;
    - the tests of a module that share a module-scoped fixture (a reference run, a trained model)
      stay together, so that the fixture is built once, not once per worker;
    - the Slurm tests, then the `slow` ones (minutes each) go first, so that one worker starts on
      them at once and no long test is left to run alone at the end.
    """
    slurm = [item for item in items if _slurm_version(item) == "22.05"]
    for item in slurm:
        item.add_marker(pytest.mark.xdist_group("slurm"))
    # the Slurm 24.11 cluster's tests: a worker of their own, after the slow tests (its root is built
    # in the background meanwhile, .ci/run)
    slurm24 = [item for item in items if _slurm_version(item) == "24.11"]
    for item in slurm24:
        item.add_marker(pytest.mark.xdist_group("slurm24"))
    ids = {id(item) for item in slurm + slurm24}
    for item in slurm + slurm24:  # `-m "not slurm"` (the fast tier) leaves them out
        item.add_marker(pytest.mark.slurm)
    rest = [item for item in items if id(item) not in ids]
    for item in rest:
        if _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(f"module-{item.module.__name__}"))
    slow = [item for item in rest if item.get_closest_marker("slow")]
    ids |= {id(item) for item in slow}
    items[:] = slurm + slow + slurm24 + [item for item in rest if id(item) not in ids]


def _slurm_version(item) -> str | None:
    """Which Slurm test cluster the test uses (None: none)."""
    names = getattr(item, "fixturenames", ())
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get("each_slurm_cluster") if callspec else None
    if "slurm24_cluster" in names or param == "24.11":
        return "24.11"
    if "slurm_cluster" in names or param == "22.05":
        return "22.05"
    return None


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory) -> Path:
    """The digits dataset, written once per test session."""
    from hpctrain.data.prep.digits import write_digits

    root = tmp_path_factory.mktemp("digits")
    write_digits(root)
    root.chmod(0o755)  # readable by the Slurm tests' ordinary users (tests/site_users.py)
    return root


@pytest.fixture(scope="session")
def site_users(tmp_path_factory):
    """Two ordinary users of one group and their project tree (tests/site_users.py): every job a
    Slurm test submits through `tests.launch.jobs.hp` runs as the first, with umask 002 and a clean
    login environment. The session's temp directories become reachable (not readable) by them;
    each Slurm test's own directory is made part of the project tree (`slurm_test_dirs`)."""
    from tests.site_users import SiteUsers
    from tests.slurm_cluster import missing

    why = missing()
    if why:
        pytest.skip(why)
    site = SiteUsers.make()
    mktemp = pytest.TempPathFactory.mktemp

    def reachable_mktemp(self, basename: str, numbered: bool = True) -> Path:
        made = mktemp(self, basename, numbered)  # 0700: searchable by others from now on, not readable
        made.chmod(made.stat().st_mode | stat.S_IXOTH)
        return made

    patch = pytest.MonkeyPatch()
    try:
        site.reach(tmp_path_factory.getbasetemp())
        patch.setattr(pytest.TempPathFactory, "mktemp", reachable_mktemp)
        yield site
    finally:
        patch.undo()
        site.remove()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory, site_users):
    """The session's Slurm test cluster: started once, stopped at the end; skipped without root/packages.
    Its users: `site_users` (slurm.conf and munge's socket are reachable by them)."""
    from tests import plan_calibration  # imports hpctrain, which a stack's session cannot when it loads this file
    from tests.launch.pyxis import build
    from tests.slurm_cluster import SlurmCluster

    root = tmp_path_factory.mktemp("slurm")
    plugstack, _ = build(root / "spank")  # the fake pyxis: srun --container-image (tests that use it say why not)
    cluster = SlurmCluster(root, plugstack=plugstack, users=site_users).start()
    try:
        yield cluster
        plan_calibration.collect(cluster, tmp_path_factory.getbasetemp())  # $HPCTRAIN_PLAN_CALIBRATION only
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm24_cluster(tmp_path_factory, site_users):
    """A second test cluster on Slurm 24.11 (Debian 13's, from the root `.ci/slurm24 --prepare` builds;
    waits for a build in progress), same API as `slurm_cluster`, same users. Skipped without the root,
    except in CI (CI set), where a missing root fails the test: the 24.11 tests must run there."""
    from tests.slurm_cluster import SlurmCluster, slurm24_sysroot

    root = tmp_path_factory.mktemp("slurm24")
    cluster = SlurmCluster(root, sysroot=slurm24_sysroot(), users=site_users).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def slurm_test_dirs(request):
    """A Slurm test's own directory (tmp_path) and its working directory are part of the users'
    project tree (group-writable, setgid), as a user's run directory on a shared site is."""
    if _slurm_version(request.node) is None and not request.node.get_closest_marker("slurm"):
        yield
        return
    site = request.getfixturevalue("site_users")
    request.getfixturevalue("elsewhere")  # the working directory of its own, first
    # again, should anything have taken the bits off (the session's root is its own: pytest_configure)
    site.reach(request.getfixturevalue("tmp_path_factory").getbasetemp())
    for d in {Path.cwd(), *([request.getfixturevalue("tmp_path")] if "tmp_path" in request.fixturenames else [])}:
        site.share(d)
    yield


@pytest.fixture(params=["22.05", "24.11"], ids=["slurm22", "slurm24"])
def each_slurm_cluster(request, site_users):  # site_users first: before any module fixture makes a directory
    """The test runs on both Slurm versions: for behaviour that differs between them (signals,
    preemption, requeue, export); the report's header says which Slurm each cluster ran."""
    cluster = request.getfixturevalue("slurm_cluster" if request.param == "22.05" else "slurm24_cluster")
    request.node.user_properties.append(("slurm", cluster.version()))
    return cluster


def pytest_runtest_logreport(report):
    """Collect which Slurm versions the tests ran on (also from xdist workers), and name a failure
    the moment it happens: pytest's own list comes only at the end, and a run stopped before then
    (a CI limit, Ctrl-C that xdist does not pass on) would not say which test failed."""
    for key, value in getattr(report, "user_properties", ()):
        if key == "slurm" and report.when == "call":
            _SLURM_VERSIONS.add(value)
    if report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        sys.stderr.write(f"\n{time.strftime('%H:%M:%S')} FAILED {report.nodeid} ({report.when})\n")


_SLURM_VERSIONS: set[str] = set()


def pytest_terminal_summary(terminalreporter):
    if _SLURM_VERSIONS:
        terminalreporter.write_line(f"Slurm test clusters: {', '.join(sorted(_SLURM_VERSIONS))}")


@pytest.fixture
def hpctrain_log(caplog, monkeypatch):
    """caplog that sees the `hpctrain` logger's records: setup_logging (entry.run, an in-process
    run) turns that logger's propagation off, so caplog's root handler would see nothing."""
    monkeypatch.setattr(logging.getLogger("hpctrain"), "propagate", True)
    return caplog
