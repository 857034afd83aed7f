"""The code snapshot (run.source) as a shared site's user meets it: an ordinary uid in a group project
tree (setgid, 2775), umask 002, a login shell that exports none of this machine's Python variables
(tests/site_users.py). Before 0.5.0 the tasks of such a user's `container.runtime: none` job wrote
`__pycache__/` (mode 775) into the snapshot they imported, and the next attempt's own check refused
it: every requeue failed. Nothing an attempt does may change the snapshot; something else that
did is refused before any task starts, at every attempt.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from hpctrain.train.ckpt import checkpoint as ckpt
from tests.helpers import wait_for
from tests.launch.jobs import (
    JOB_SETS,
    JOB_STEPS,
    digits_sets,
    job_report,
    metrics,
    sacct_states,
    submit,
    uninterrupted,
)

pytestmark = pytest.mark.slurm
SETS = (*JOB_SETS, "ckpt.every=10")


def attempts(run) -> int:
    """How many attempts started rank 0 (each appends its start line to the rank's log)."""
    log = run / "logs" / "rank-0.log"
    return log.read_text().count("world size 2 ") if log.exists() else 0


def test_an_ordinary_users_job_under_umask_002_goes_through_a_requeue_and_a_planted_pyc_is_refused(
    slurm_cluster, digits_root, tmp_path, tmp_path_factory
):
    """Two jobs of the first site user, 2 nodes × 1 task each, the tasks on the host's Python
    (`container.runtime: none`, the test cluster's `local` profile), in the project tree: each is
    stopped with USR2 once it has trained 12 steps (the user's own `scancel`), and requeued by its
    batch shell. The first resumes where it stopped and ends with an uninterrupted run's weights, its
    snapshot exactly as submitted (read-only, no bytecode). Into the second one's snapshot a `.pyc`
    is put before the stop, as a Python of the user's without PYTHONDONTWRITEBYTECODE would leave it:
    the requeued attempt refuses it in one line and starts no task."""
    users = slurm_cluster.users
    user = users.users[0]
    reference = uninterrupted(2, digits_root, tmp_path_factory)  # first: a job trains its 44 steps in ~15 s
    runs = {name: tmp_path / name for name in ("clean", "planted")}
    args = ("--nodes", "2", "--gpus-per-node", "1")  # 2 ranks, as the uninterrupted reference
    jobs = {name: submit(slurm_cluster, *args, *digits_sets(digits_root, tmp_path, name, *SETS)) for name in runs}

    def trained(name: str, step: int) -> bool:
        steps = [r["step"] for r in metrics(runs[name], "train")]
        return bool(steps) and steps[-1] >= step

    snaps = {name: next((runs[name] / "code").glob("*/hpctrain")) for name in runs}
    pyc = snaps["planted"] / "train" / "__pycache__" / "loop.cpython-311.pyc"
    sent: set[str] = set()

    def send_due() -> bool:  # each job once it has trained 12 steps (a checkpoint at 10), the .pyc first
        for name, job in jobs.items():
            if name in sent or not trained(name, 12):
                continue
            if name == "planted":
                plant = 'chmod u+w "$1" && mkdir "$1/__pycache__" && echo x > "$2" && chmod u-w "$1"'
                r = slurm_cluster.user_run(["bash", "-c", plant, "plant", str(pyc.parent.parent), str(pyc)])
                assert r.returncode == 0, r.stderr
            r = slurm_cluster.user_run(["scancel", "--signal=USR2", job])  # the user's own
            assert r.returncode == 0, r.stderr
            sent.add(name)
        return len(sent) == len(jobs)

    wait_for(
        send_due,
        "the jobs never reached step 12",
        show=lambda: "\n".join(job_report(slurm_cluster, jobs[n], runs[n]) for n in runs if n not in sent),
        poll_s=0.3,
    )

    # the clean job: requeued once, resumed at its stop, the uninterrupted run's weights
    clean, job = runs["clean"], jobs["clean"]
    assert slurm_cluster.wait_done(job, 400) == "COMPLETED", job_report(slurm_cluster, job, clean)
    assert sacct_states(slurm_cluster, job) == ["REQUEUED", "COMPLETED"]
    (stop,) = metrics(clean, "stop")
    log0 = (clean / "logs" / "rank-0.log").read_text()
    assert "resumed from " in log0 and f"at step {stop['step']}" in log0, log0
    final = ckpt.load(ckpt.list_checkpoints(clean)[0])
    assert final["step"] == JOB_STEPS
    assert all(torch.equal(final["model"][k], v) for k, v in reference.items())
    snap = snaps["clean"]
    assert not list(snap.rglob("__pycache__")), sorted(snap.rglob("__pycache__"))
    for p in [snap, *snap.rglob("*")]:  # read-only and the user's: nothing an attempt could write
        st = p.lstat()
        assert st.st_uid == user.uid and not stat.S_IMODE(st.st_mode) & 0o222, (p, oct(st.st_mode))
    # the run is the user's, in the project's group (the setgid tree), as their umask leaves it
    st = clean.stat()
    assert (st.st_uid, st.st_gid) == (user.uid, users.gid) and stat.S_IMODE(st.st_mode) & 0o070 == 0o070
    env = json.loads((clean / "env.json").read_text())
    assert env["source"]["running"] == env["source"]["submitted"] == snap.parent.name

    # the planted job: its second attempt refuses the snapshot before any task starts
    bad, job = runs["planted"], jobs["planted"]
    assert slurm_cluster.wait_done(job, 400) == "FAILED", job_report(slurm_cluster, job, bad)
    out = "".join(p.read_text() for p in sorted((bad / "submitit").glob(f"{job}_0_log.*")))  # the batch shell's
    said = [line for line in out.splitlines() if line.startswith("hpctrain: the code snapshot")]
    assert said == [
        f"hpctrain: the code snapshot {snaps['planted']} can be changed by another user ({pyc.parent}: owner uid "
        f"{user.uid}, mode 775): check who changed it, then remove "
        f"{snaps['planted'].parent} (chmod -R u+w {snaps['planted'].parent} && rm -r {snaps['planted'].parent}) and "
        "submit again"
    ], out
    assert attempts(bad) == 1, (bad / "logs" / "rank-0.log").read_text()  # no task of the second attempt
    assert os.path.exists(pyc)
