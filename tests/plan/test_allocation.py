"""The account's allocation on the real test cluster (plan/allocation.py): which account a submission
without one is charged to, read with as few calls to slurmctld and slurmdbd as the answer allows."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from hpctrain.site.slurm_cli import CALL_LOG_VAR

READ = (
    "import json; from hpctrain.plan.allocation import read_allocation; a = read_allocation(); "
    "print(json.dumps([a.account, a.limit] if a else None))"
)


@pytest.mark.slurm
def test_an_only_account_comes_from_sshare_alone_and_of_several_slurmdbd_names_the_default(slurm_cluster, tmp_path):
    """A user in one account: `sshare` (no -a/-A: the user's own associations) names it, and its
    GrpTRESMins, in one call; in two: `sacctmgr show user` says which is the default (sbatch's)."""
    user = slurm_cluster.users.users[0]
    run = lambda *a: slurm_cluster.run(*a, check=False)  # noqa: E731
    tmp_path.chmod(0o777)

    def read(tag: str) -> tuple[list, Counter]:
        log = tmp_path / f"{tag}.jsonl"
        env = {CALL_LOG_VAR: str(log), "XDG_CACHE_HOME": str(tmp_path / f"cache-{tag}")}
        r = slurm_cluster.user_run([sys.executable, "-c", READ], user, env)
        assert r.returncode == 0, r.stdout + r.stderr
        calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return json.loads(r.stdout), Counter(c["kind"] for c in calls if not c["cached"])

    for acc, limit in (("t55one", "node=1000"), ("t55two", "node=50")):
        run("sacctmgr", "-i", "add", "account", acc, "Description=t", "Organization=t", f"GrpTRESMins={limit}")
    try:
        run("sacctmgr", "-i", "add", "user", user.name, "account=t55one")
        alloc, calls = read("one")
        assert alloc == ["t55one", {"node": 1000.0}] and calls == Counter(sshare=1), (alloc, calls)
        run("sacctmgr", "-i", "add", "user", user.name, "account=t55two")
        run("sacctmgr", "-i", "modify", "user", user.name, "set", "defaultaccount=t55two")
        alloc, calls = read("two")
        assert alloc == ["t55two", {"node": 50.0}] and calls == Counter(sshare=1, sacctmgr=1), (alloc, calls)
    finally:
        run("sacctmgr", "-i", "delete", "user", user.name)
        run("sacctmgr", "-i", "delete", "account", "t55one", "t55two")
