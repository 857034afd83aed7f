"""Stops and requeues on the Slurm test cluster, as real sites send them, with the tasks inside a
container that has no Slurm client (tests/launch/fake_apptainer.sh masks every Slurm command).

Every signal path ends in a run whose final weights equal an uninterrupted run's (`torch.equal`),
resumed at the step where it stopped — or, when srun itself kills the tasks (it turns a SIGTERM
it receives into SIGKILL), at the last periodic checkpoint.

Most jobs run 2 nodes × 1 task, where a sum over ranks is order-free (a + b = b + a). The site-style
paths a big run meets (partition preemption, an outside `scontrol requeue`) run 2 nodes × 2 tasks with
the training defaults (static_graph on, no accumulation): with 4 ranks DDP's bucket layout decides the
order of every sum, so only a resume that restores it exactly ends bit-identical (docs/checkpoints.md).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from hpctrain.run.source import source_hash
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.dist import port_from_job_id
from tests.helpers import polling, this_python_as, wait_for
from tests.launch.jobs import (
    JOB_SETS,
    JOB_STEPS,
    ROOT,
    digits_sets,
    hp,
    job_report,
    metrics,
    sacct_states,
    submit,
    uninterrupted,
    wait_for_step,
)
from tests.slurm_cluster import GRACE_TIME, PREEMPTIBLE, URGENT

pytestmark = pytest.mark.slurm
FAKE_APPTAINER = Path(__file__).with_name("fake_apptainer.sh")
STEPS = JOB_STEPS
SETS = (*JOB_SETS, "ckpt.every=10")


@pytest.fixture(scope="module")
def reference(digits_root, tmp_path_factory) -> dict:
    """What a 2 nodes × 1 task job must end with."""
    return uninterrupted(2, digits_root, tmp_path_factory)


@pytest.fixture(scope="module")
def reference4(digits_root, tmp_path_factory) -> dict:
    """What a 2 nodes × 2 tasks job must end with."""
    return uninterrupted(4, digits_root, tmp_path_factory)


@pytest.fixture(scope="module")
def container(tmp_path_factory) -> tuple[Path, dict]:
    """A profile whose tasks run through the fake `apptainer exec`, and the env that finds it."""
    d = tmp_path_factory.mktemp("container")
    (d / "bin").mkdir()
    (d / "bin" / "apptainer").symlink_to(FAKE_APPTAINER)
    (d / "image.sif").write_bytes(b"not an image: the fake apptainer runs the host python")
    # the image's mount point for the snapshot: an ordinary user's fake apptainer cannot make it in this
    # directory of root's (the real one makes missing mount points inside the container, not on the host)
    (d / "mnt" / "hpctrain").mkdir(parents=True)
    prof = d / "container.yaml"
    prof.write_text(
        yaml.safe_dump(
            {
                "name": "no-slurm-in-container",
                "slurm": {
                    "request_gpus": False,
                    "gpus_per_node": 1,
                    "max_gpus_per_node": 4,
                    "time": "30",
                    "max_requeues": 3,
                },
                "container": {"runtime": "apptainer", "image": str(d / "image.sif"), "source_mount": str(d / "mnt")},
            }
        )
    )
    import os

    env = {"PATH": f"{d / 'bin'}:{os.environ['PATH']}", "FAKE_APPTAINER_PYTHON": sys.executable}
    return prof, env


@pytest.fixture(scope="module")
def containers(container) -> dict[str, tuple[Path, dict]]:
    """Profiles by container.runtime: `container`'s; the same through the fake SingularityCE
    (fake_apptainer.sh called as `singularity`: SINGULARITYENV_* only, no `apptainer` for it); and
    through the fake pyxis plugin of the test cluster (srun --container-image; tests/launch/fake_pyxis.c),
    whose image is its /etc/environment: the image's PATH, where `python3` is this Python."""
    prof, env = container
    d = prof.parent
    (d / "bin" / "singularity").symlink_to(FAKE_APPTAINER)
    this_python_as(d / "imgbin" / "python3")
    (d / "image.sqsh").write_text(
        f"PATH={d / 'imgbin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nHPCTRAIN_FAKE_IMAGE=pyxis\n"
    )
    out = {"apptainer": container}
    for runtime, image in (("singularity", d / "image.sif"), ("pyxis", d / "image.sqsh")):
        data = yaml.safe_load(prof.read_text())
        data["container"].update(runtime=runtime, image=str(image))
        (d / f"{runtime}.yaml").write_text(yaml.safe_dump(data))
        out[runtime] = (d / f"{runtime}.yaml", env)
    return out


def submit_job(cluster, container, digits_root, tmp_path, name: str, *args: str, tasks_per_node: int = 1) -> str:
    """`hpctrain submit` of the digits run on both nodes (tasks_per_node: --gpus-per-node; the test
    cluster's CPU-only profile asks Slurm for no GPUs, and each task gets Slurm's default 1 CPU)."""
    prof, env = container
    return submit(
        cluster,
        "--cluster",
        str(prof),
        "--nodes",
        "2",
        "--gpus-per-node",
        str(tasks_per_node),
        *args,
        *digits_sets(digits_root, tmp_path, name, *SETS),
        env=env,
    )


@pytest.fixture
def site_datasets():
    """The site directory the committed vit.sbatch binds into the image (`--bind /datasets`, the
    example-ib profile's): a site that runs the script as it is has it; Apptainer, and the fake one,
    refuse a bind whose source is missing (every task exited 1 on a fresh machine). Made for the
    test when the machine lacks it, and removed after."""
    path = Path("/datasets")
    made = not path.exists()
    if made:
        path.mkdir()
    yield path
    if made:
        path.rmdir()


def sbatch_job(cluster, container, digits_root, tmp_path, name: str) -> str:
    """The same job through `sbatch slurm/vit.sbatch` as committed, its tasks in the (fake) image
    (the site's /datasets must exist: the `site_datasets` fixture)."""
    prof, env = container
    image = yaml.safe_load(prof.read_text())["container"]["image"]
    sets = [f"data.root={digits_root}", f"run.dir={tmp_path}", f"run.name={name}", "train.threads=1", *SETS]
    env = {
        **env,
        "CONTAINER": "apptainer",
        "HPCTRAIN_IMAGE": image,
        "HPCTRAIN_SOURCE": str(ROOT / "src" / "hpctrain"),
        "HPCTRAIN_MODULES": "",
        "HPCTRAIN_CONTAINER_MODULES": "",
        "HPCTRAIN_CONFIG": str(ROOT / "configs" / "digits_vit.yaml"),
        "HPCTRAIN_SET": json.dumps(sets),
        "OMP_NUM_THREADS": "1",
    }
    r = cluster.run(
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=0",
        "--cpus-per-task=1",
        "--mem=0",
        f"--partition={cluster.partition}",
        f"--output={tmp_path}/{name}-%j.out",
        str(ROOT / "slurm" / "vit.sbatch"),
        env=env,
        cwd=tmp_path,
    )
    return r.stdout.strip()


def assert_same_weights(run: Path, reference: dict) -> None:
    final = ckpt.load(ckpt.list_checkpoints(run)[0])
    assert final["step"] == STEPS
    assert final["model"].keys() == reference.keys()
    differ = [k for k, v in reference.items() if not torch.equal(final["model"][k], v)]
    assert not differ, (
        f"{len(differ)} of {len(reference)} tensors differ from the uninterrupted run's, max "
        f"{max((final['model'][k] - reference[k]).abs().max().item() for k in differ):.2e}: "
        f"{differ[:5]}"
    )


def assert_two_tasks_per_node(run: Path, attempts: int = 2) -> None:
    """In every attempt, ranks 0-1 ran on one node and 2-3 on another (SLURM_PROCID in block order,
    as the reference's ranks 0-3), and each trained 16 of the global 64 images a step, as the
    reference does."""
    hosts = []
    for rank in range(4):
        log = (run / "logs" / f"rank-{rank}.log").read_text()
        hosts.append(re.findall(rf"world size 4 on \S+ \(submitit-slurm\); rank {rank} on host (\S+)$", log, re.M))
        assert log.count("batch 64 global = 16 per rank x 4 ranks x 1 accumulation steps") == attempts, log
    for attempt in zip(*hosts, strict=True):
        assert attempt[0] == attempt[1] != attempt[2] == attempt[3], hosts
    assert len(hosts[0]) == attempts, hosts


def resumed_at(run: Path) -> list[int]:
    log0 = (run / "logs" / "rank-0.log").read_text()
    return [int(s) for s in re.findall(r"INFO resumed from \S+ at step (\d+)$", log0, re.M)]


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
# how each path is sent: (scancel/scontrol arguments, kind recorded by the tasks or None when the
# tasks are killed before they can stop, requeued by the batch shell?)
PATHS = {
    "scancel USR2": (["scancel", "--signal=USR2"], "time_limit"),
    "scancel USR2 --batch": (["scancel", "--signal=USR2", "--batch"], "time_limit"),
    "scancel USR2 --full": (["scancel", "--signal=USR2", "--full"], "time_limit"),
    "scancel TERM": (["scancel", "--signal=TERM"], "preemption"),
    "scancel TERM --full": (["scancel", "--signal=TERM", "--full"], None),
    "scontrol requeue": (["scontrol", "requeue"], "preemption"),
    "vit.sbatch, scancel USR2": (["scancel", "--signal=USR2"], "time_limit"),  # the script's own shell requeues
}
# The runtime each path's tasks run in (apptainer otherwise): one path each for the others, so that
# every runtime goes through a stop, the batch shell's requeue and an exact resume without another job.
RUNTIME = {"scancel USR2 --batch": "singularity", "scancel USR2": "pyxis"}  # pyxis: 22.05 (the plugin's)
# On Slurm 24.11, the paths whose handling by Slurm differs in kind, not in the signal's route (the
# others test our batch shell and srun, the same on both): USR2 to the batch shell, which requeues
# itself and resumes exactly; an outside `scontrol requeue`, which Slurm requeues itself (the shell
# must leave it alone: one REQUEUED row, not two).
PATHS_24 = ("scancel USR2 --batch", "scontrol requeue")
# Run 2 nodes × 2 tasks (the others 2 × 1): an outside `scontrol requeue` as a site's admin or a
# health check sends it to a multi-GPU job, resumed bit-exact at 4 ranks.
TWO_PER_NODE = ("scontrol requeue",)


def test_every_stop_signal_path_resumes_exactly_without_slurm_in_the_container(
    each_slurm_cluster, containers, digits_root, tmp_path, reference, reference4, site_datasets, request
):
    """Seven jobs at once (six through submitit, one through `sbatch slurm/vit.sbatch`), each
    stopped one way mid-run; none can run a Slurm command in its tasks. On 24.11: PATHS_24. The
    tasks of the paths in RUNTIME run in that runtime (SingularityCE: the fake `singularity`). The
    TWO_PER_NODE ones train on 4 ranks and end with the uninterrupted 4-rank run's weights."""
    slurm_cluster = each_slurm_cluster
    paths = PATHS if "22.05" in slurm_cluster.version() else {k: PATHS[k] for k in PATHS_24}
    if any(RUNTIME.get(label) == "pyxis" for label in paths):
        assert slurm_cluster.plugstack, "the fake pyxis plugin was not built: apt-get install gcc libslurm-dev"
    runs = {label: tmp_path / f"j{i}" for i, label in enumerate(paths)}
    jobs: dict[str, str] = {}
    sent: set[str] = set()
    # a failure leaves no job training beside the next tests (they would run on a loaded machine)
    request.addfinalizer(lambda: [slurm_cluster.run("scancel", job, check=False) for job in jobs.values()])

    def send_due() -> bool:  # signal each job once it has trained 12 steps (one checkpoint)
        for label, job in list(jobs.items()):
            steps = [r["step"] for r in metrics(runs[label], "train")]
            if label not in sent and steps and steps[-1] >= 12:
                slurm_cluster.run(*paths[label][0], job)
                sent.add(label)
            elif label not in sent and slurm_cluster.state(job) in ENDED:  # it will never get there
                pytest.fail(
                    f"{label}: the job ended before step 12:\n{job_report(slurm_cluster, job, runs[label])}",
                    pytrace=False,
                )
        return len(sent) == len(paths)

    # The first jobs are signalled while the later ones are still being submitted: on a loaded
    # machine one `hpctrain submit` takes ~12 s and a job trains its 44 steps in ~22 s.
    with polling(send_due, poll_s=0.3):
        for i, label in enumerate(paths):
            container = containers[RUNTIME.get(label, "apptainer")]
            jobs[label] = (
                sbatch_job(slurm_cluster, container, digits_root, tmp_path, f"j{i}")
                if label.startswith("vit.sbatch")
                else submit_job(
                    slurm_cluster,
                    container,
                    digits_root,
                    tmp_path,
                    f"j{i}",
                    tasks_per_node=2 if label in TWO_PER_NODE else 1,
                )
            )
    wait_for(
        send_due,
        "jobs never reached step 12",
        show=lambda: "\n".join(
            f"{label}: {job_report(slurm_cluster, jobs[label], runs[label])}" for label in paths if label not in sent
        ),
        poll_s=0.3,
    )
    for label, (_, kind) in paths.items():
        job, run = jobs[label], runs[label]
        assert slurm_cluster.wait_done(job, 400) == "COMPLETED", (label, sacct_states(slurm_cluster, job))
        assert sacct_states(slurm_cluster, job) == ["REQUEUED", "COMPLETED"], label
        stops = metrics(run, "stop")
        if kind is None:  # srun got the TERM and SIGKILLed its tasks: back to the last checkpoint
            assert stops == [] and resumed_at(run) and resumed_at(run)[0] % 10 == 0, (label, resumed_at(run))
        else:
            assert [s["stop_kind"] for s in stops] == [kind], (label, stops)
            assert resumed_at(run) == [stops[0]["step"]], label  # nothing lost
            (req,) = metrics(run, "requeue")
            assert req["requeue"] and req["reason"] == kind and req["job"] == job
        if label in TWO_PER_NODE:
            assert_two_tasks_per_node(run)
        assert_same_weights(run, reference4 if label in TWO_PER_NODE else reference)
        script = label.startswith("vit.sbatch")
        outs = (
            [tmp_path / f"j{list(paths).index(label)}-{job}.out"]
            if script
            else (run / "submitit").glob(f"{job}_0_log.out")
        )
        out = "".join(p.read_text() for p in outs)
        assert out and ("scontrol requeue" not in out.lower() or "failed" not in out.lower()), out
        env = json.loads((run / "env.json").read_text())
        assert env["launcher"] == ("sbatch-script" if script else "submitit-slurm"), label
        assert env["env"]["SLURM_RESTART_COUNT"] == "1"
        runtime = RUNTIME.get(label, "apptainer")  # which runtime started the task
        if runtime == "pyxis":  # the image's environment (its /etc/environment), none of Apptainer's
            assert env["env"].get("HPCTRAIN_FAKE_IMAGE") == "pyxis", (label, env["env"])
            assert not [k for k in env["env"] if k.endswith("_CONTAINER")], (label, env["env"])
        else:  # the image's own variable
            assert env["env"].get(f"{runtime.upper()}_CONTAINER"), (label, env["env"])
        if not script:  # every runtime ran the submitted snapshot, mounted at container.source_mount
            mount = yaml.safe_load(containers[runtime][0].read_text())["container"]["source_mount"]
            assert env["source"]["path"] == f"{mount}/hpctrain", (label, env["source"])
            assert env["source"]["running"] == env["source"]["submitted"], (label, env["source"])
    if "scancel TERM" in jobs:
        r = hp(slurm_cluster, "status", jobs["scancel TERM"])
        assert "requeues       1 (1 after preemption, 0 after a time limit" in r.stdout, r.stdout + r.stderr
    r = hp(slurm_cluster, "status", jobs["scancel USR2 --batch"])
    assert "requeues       1 (0 after preemption, 1 after a time limit" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_requeue_after_the_checkout_changed_runs_the_submitted_snapshot(
    slurm_cluster, container, digits_root, tmp_path, reference
):
    """Submit from a copy of the package (the user's checkout); while the job trains, edit a module
    the tasks import (it now raises on import) and add a new one, then stop the job with USR2. The
    requeued attempt runs the snapshot taken at submission: it resumes where it stopped and ends
    with the uninterrupted run's weights. (Before snapshots every rank of that attempt refused: the
    live checkout's hash differed from the submitted one.) A new submission of the same run takes a
    new snapshot, says so, and runs the edited code."""
    checkout = tmp_path / "checkout" / "src"
    shutil.copytree(ROOT / "src" / "hpctrain", checkout / "hpctrain", ignore=shutil.ignore_patterns("__pycache__"))
    submitted = source_hash(checkout / "hpctrain")
    prof, env = container
    env = {**env, "PYTHONPATH": str(checkout)}  # the CLI runs the checkout's hpctrain
    args = ("--cluster", str(prof), "--nodes", "2", *digits_sets(digits_root, tmp_path, "moved", *SETS))
    job = submit(slurm_cluster, *args, env=env)
    run = tmp_path / "moved"
    wait_for_step(run, 5, 300)
    loop = checkout / "hpctrain" / "train" / "loop.py"
    loop.write_text(loop.read_text() + "\nraise ImportError('edited after submission')\n")
    (checkout / "hpctrain" / "added_later.py").write_text("X = 1\n")
    slurm_cluster.run("scancel", "--signal=USR2", job)
    assert slurm_cluster.wait_done(job, 300) == "COMPLETED", sacct_states(slurm_cluster, job)
    assert sacct_states(slurm_cluster, job) == ["REQUEUED", "COMPLETED"]
    (stop,) = metrics(run, "stop")
    assert resumed_at(run) == [stop["step"]]
    assert_same_weights(run, reference)
    rec = json.loads((run / "env.json").read_text())
    snap = run / "code" / submitted / "hpctrain"
    assert rec["env"]["SLURM_RESTART_COUNT"] == "1"  # written by the requeued attempt
    assert rec["source"]["running"] == rec["source"]["submitted"] == submitted != source_hash(checkout / "hpctrain")
    assert rec["source"]["snapshot"]["path"] == str(snap) and rec["source"]["snapshot"]["hash"] == submitted
    assert rec["source"]["snapshot"]["from"] == str(checkout / "hpctrain")
    assert not (snap / "added_later.py").exists() and source_hash(snap) == submitted
    # the run has finished: a new submission trains it further (a finished run's rerun is refused)
    again = hp(
        slurm_cluster, "submit", "--config", "configs/digits_vit.yaml", *args, "--set", "train.epochs=3", env=env
    )
    assert again.returncode == 0, again.stdout + again.stderr
    new = source_hash(checkout / "hpctrain")
    assert f"the code changed since this directory's last submission: source {submitted} → {new}" in again.stdout, (
        again.stdout
    )
    job2 = re.search(r"submitted Slurm job (\d+)", again.stdout).group(1)
    assert slurm_cluster.wait_done(job2, 120) == "FAILED"
    err = "".join(p.read_text() for p in (run / "submitit").glob(f"{job2}_*_log.err"))
    assert "ImportError: edited after submission" in err, err
    assert (run / "code" / new / "hpctrain" / "added_later.py").is_file()


def test_partition_preemption_with_grace_time_resumes_exactly(
    each_slurm_cluster, container, digits_root, tmp_path, reference4
):
    """A job of 2 nodes × 2 tasks with the training defaults in the preemptible partition; a job in
    the urgent partition takes both nodes: ours gets SIGTERM, checkpoints within the GraceTime, and
    is requeued once — by the batch shell on 22.05 (a job that ends inside its grace time is
    COMPLETED there), by Slurm itself on 24.11 (since 24.05 it requeues such a job; the shell then
    leaves it alone) — and resumes at that step once the urgent job is done, ending with the weights
    of an uninterrupted 4-rank run."""
    slurm_cluster = each_slurm_cluster
    job = submit_job(
        slurm_cluster, container, digits_root, tmp_path, "pre", "--partition", PREEMPTIBLE, tasks_per_node=2
    )
    run = tmp_path / "pre"
    wait_for_step(run, 12, 300)
    urgent = slurm_cluster.run(
        "sbatch",
        "--parsable",
        f"--partition={URGENT}",
        "-N2",
        "--exclusive",
        f"--output={tmp_path}/urgent-%j.out",
        "--wrap",
        "sleep 2",
    ).stdout.strip()
    assert slurm_cluster.wait_done(urgent, 120) == "COMPLETED"
    assert slurm_cluster.wait_done(job, 400) == "COMPLETED"
    # one requeue, whoever made it: never two. Slurm logs the run it requeued itself as PREEMPTED (24.11),
    # one that our shell requeued as REQUEUED (22.05)
    first = "PREEMPTED" if "24.11" in slurm_cluster.version() else "REQUEUED"
    assert sacct_states(slurm_cluster, job) == [first, "COMPLETED"]
    (stop,) = metrics(run, "stop")
    assert stop["stop_kind"] == "preemption" and resumed_at(run) == [stop["step"]]
    # who requeued: Slurm >= 24.05 itself (our shell's own `scontrol requeue` there left the job marked
    # preempted, and its finished next run was requeued again: REQUEUED, PREEMPTED, COMPLETED)
    shell = "".join(p.read_text() for p in (run / "submitit").glob(f"{job}_*_log.out"))
    assert ("requeues the job itself as this shell ends" in shell) == ("24.11" in slurm_cluster.version()), shell
    assert_two_tasks_per_node(run)
    assert_same_weights(run, reference4)
    # Slurm signals every task at once; the rank that had it by the agreeing step logged it (rank 0
    # may get it only after another rank's request stopped the step: then it logs it at the stop)
    assert any("received SIGTERM" in p.read_text() for p in (run / "logs").glob("rank-*.log"))
    assert GRACE_TIME > 5  # the checkpoint fitted in the grace time: no SIGKILL, nothing lost


def preempt_both_nodes(cluster, tmp_path) -> None:
    """A job in the urgent partition takes both nodes for 2 s: the preemptible jobs there get SIGTERM."""
    urgent = cluster.run(
        "sbatch", "--parsable", f"--partition={URGENT}", "-N2", "--exclusive",
        f"--output={tmp_path}/urgent-%j.out", "--wrap", "sleep 2",
    ).stdout.strip()  # fmt: skip
    assert cluster.wait_done(urgent, 120) == "COMPLETED"


def job_fields(cluster, job: str) -> dict[str, str]:
    out = cluster.run("scontrol", "show", "job", "-o", job, check=False).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def test_cancel_mode_preemption_is_requeued_and_the_finished_run_reads_completed(
    slurm24_cluster, container, digits_root, tmp_path
):
    """Slurm 24.11, a partition with PreemptMode=CANCEL and a GraceTime: the preempted job checkpoints and
    the batch shell requeues it (Slurm would not), and it resumes at that step and finishes. Slurm keeps
    its preemption mark after our requeue and records the finished run PREEMPTED (sacct REQUEUED,
    PREEMPTED): `hpctrain status` and `submit --wait` go by the run's own end, COMPLETED."""
    cluster = slurm24_cluster
    cluster.run("scontrol", "update", f"PartitionName={PREEMPTIBLE}", "PreemptMode=CANCEL")
    try:
        job = submit_job(cluster, container, digits_root, tmp_path, "cancel", "--partition", PREEMPTIBLE)
        run = tmp_path / "cancel"
        wait_for_step(run, 12, 300)
        preempt_both_nodes(cluster, tmp_path)
        assert cluster.wait_done(job, 400) == "PREEMPTED"  # Slurm's record of a run that finished
    finally:
        cluster.run("scontrol", "update", f"PartitionName={PREEMPTIBLE}", "PreemptMode=REQUEUE")
    assert sacct_states(cluster, job) == ["REQUEUED", "PREEMPTED"]
    (stop,) = metrics(run, "stop")
    assert stop["stop_kind"] == "preemption" and resumed_at(run) == [stop["step"]]
    assert metrics(run, "end")[-1]["status"] == "finished"
    shell = "".join(p.read_text() for p in (run / "submitit").glob(f"{job}_*_log.out"))
    assert "keeps its preemption mark on job" in shell and "preempt mode CANCEL" in shell, shell
    st = hp(cluster, "status", job)
    assert st.returncode == 0 and re.search(r"^\s*state\s+COMPLETED$", st.stdout, re.M), st.stdout + st.stderr


def test_preempted_job_past_its_preemption_cap_stays_ended(slurm24_cluster, container, digits_root, tmp_path):
    """Slurm 24.11, PreemptMode=REQUEUE: Slurm requeues a preempted --requeue job as its batch shell ends,
    whatever its exit status. With slurm.max_preemptions=0 the tasks decide to end; the shell turns the
    job's Requeue off first, so it stays ended (PREEMPTED, no restart) and says why."""
    cluster = slurm24_cluster
    job = submit_job(
        cluster, container, digits_root, tmp_path, "capped", "--partition", PREEMPTIBLE,
        "--cluster-set", "slurm.max_preemptions=0",
    )  # fmt: skip
    run = tmp_path / "capped"
    wait_for_step(run, 5, 300)
    preempt_both_nodes(cluster, tmp_path)
    assert cluster.wait_done(job, 400) == "PREEMPTED"
    # Slurm's own requeue would show now: the job back to PENDING with Restarts=1
    fields = wait_for(
        lambda: (f := job_fields(cluster, job)).get("JobState") not in (None, "COMPLETING") and f,
        f"job {job} to leave COMPLETING",
        show=lambda: cluster.run("sacct", "-n", "-P", "-D", "-j", job, check=False).stdout,
    )
    assert (fields["JobState"], fields["Restarts"], fields["Requeue"]) == ("PREEMPTED", "0", "0"), fields
    assert sacct_states(cluster, job) == ["PREEMPTED"]
    shell = "".join(p.read_text() for p in (run / "submitit").glob(f"{job}_*log*"))  # the batch shell's too
    assert "set to Requeue=0" in shell, shell
    st = hp(cluster, "status", job)
    assert "max_preemptions=0" in st.stdout and "PREEMPTED" in st.stdout, st.stdout + st.stderr


def test_requeue_cap_reached_ends_the_job_nonzero_and_says_why(slurm_cluster, container, digits_root, tmp_path):
    prof, env = container
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "submit",
            "--config",
            "configs/digits_vit.yaml",
            "--cluster",
            str(prof),
            "--cluster-set",
            "slurm.max_requeues=0",
            "--nodes",
            "2",
            "--wait",
            *digits_sets(digits_root, tmp_path, "cap", *SETS),
        ],
        env=slurm_cluster.environ({"OMP_NUM_THREADS": "1", **env}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = tmp_path / "cap"
    wait_for_step(run, 5, 300)
    job = json.loads((run / "job.json").read_text())["job_id"]
    slurm_cluster.run("scancel", "--signal=USR2", job)
    out = waiter.communicate(timeout=300)[0]
    assert waiter.returncode == 1, out
    assert "FAILED" in out and "not requeued" in out and "max_requeues=0" in out, out
    assert re.search(r"^step \d+/\d+ \(\d+%\) · epoch", out.split("\nhpctrain status\n")[0], re.M), out  # progress
    st = hp(slurm_cluster, "status", job)
    assert st.returncode == 1 and "max_requeues=0" in st.stdout
    shell = "".join(p.read_text() for p in (run / "submitit").glob(f"{job}_*log*"))  # batch shell's output too
    assert "hpctrain: stopped and not requeued" in shell, shell


def test_array_elements_sharing_a_node_rendezvous_apart(slurm_cluster, digits_root, tmp_path):
    """Two array elements whose rank 0 share n1, started by plain sbatch with the login shell's
    stale MASTER_ADDR/MASTER_PORT exported: each derives its own port from its SLURM_JOB_ID."""
    wrap = (
        'export HPCTRAIN_SET=$(printf \'["data.root=%s", "run.dir=%s", "run.name=arr%s", '
        '"train.max_steps=6", "train.threads=1", "train.eval_every_epochs=0"]\' "$DIGITS" "$RUNS" '
        '"$SLURM_ARRAY_TASK_ID"); exec bash "$SBATCH_SCRIPT"'
    )
    env = {
        "CONTAINER": "none",
        "HPCTRAIN_MODULES": "",
        "HPCTRAIN_CONFIG": str(ROOT / "configs/digits_vit.yaml"),
        "DIGITS": str(digits_root),
        "RUNS": str(tmp_path),
        "SBATCH_SCRIPT": str(ROOT / "slurm" / "vit.sbatch"),
        "MASTER_ADDR": "login-node.invalid",
        "MASTER_PORT": "1",
        "OMP_NUM_THREADS": "1",
    }
    r = slurm_cluster.run(
        "sbatch",
        "--parsable",
        "--array=0-1",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--nodelist=n1",
        f"--partition={slurm_cluster.partition}",
        f"--output={tmp_path}/arr-%A_%a.out",
        "--wrap",
        wrap,
        env=env,
        cwd=tmp_path,
    )
    array = r.stdout.strip()
    for i in (0, 1):
        out = tmp_path / f"arr-{array}_{i}.out"
        assert slurm_cluster.wait_done(f"{array}_{i}", 300) == "COMPLETED", out.read_text()
    recs = [json.loads((tmp_path / f"arr{i}" / "env.json").read_text()) for i in (0, 1)]
    jobs = [rec["env"]["SLURM_JOB_ID"] for rec in recs]
    assert len(set(jobs)) == 2
    for rec, job in zip(recs, jobs):
        assert rec["rendezvous"] == f"n1:{port_from_job_id(job)}" and rec["launcher"] == "sbatch-script"
    assert recs[0]["rendezvous"] != recs[1]["rendezvous"]


def header_example() -> str:
    """The usage example in slurm/vit.sbatch's header, as a shell command line."""
    lines = (ROOT / "slurm" / "vit.sbatch").read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.endswith("without the image:")) + 1
    body = []
    for x in lines[start:]:
        if not x.startswith("#   "):
            break
        body.append(x[4:])
    return "\n".join(body)


def test_sbatch_header_example_runs_as_written_on_a_cpu_only_cluster(slurm_cluster, tmp_path):
    """Copy the repository's configs/ and slurm/ to a fresh directory and run the header's lines
    there, word for word; `hpctrain status <job>` finds the run from the job id alone, also right
    after submission (accounting may not know the job yet)."""
    import shutil

    shutil.copytree(ROOT / "configs", tmp_path / "configs", symlinks=False)
    (tmp_path / "slurm").mkdir()
    shutil.copy(ROOT / "slurm" / "vit.sbatch", tmp_path / "slurm" / "vit.sbatch")
    cmd = header_example()
    assert "sbatch" in cmd and "slurm/vit.sbatch" in cmd
    r = subprocess.run(
        ["bash", "-c", cmd],
        cwd=tmp_path,
        env={**slurm_cluster.env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[-1]
    early = hp(slurm_cluster, "status", job, cwd=tmp_path)
    assert early.returncode == 0 and job in early.stdout, early.stdout + early.stderr
    assert slurm_cluster.wait_done(job, 300) == "COMPLETED", next(tmp_path.glob("slurm-*.out")).read_text()
    run = tmp_path / "runs" / "cpu-example"
    assert metrics(run, "end")[-1]["status"] == "finished"
    st = hp(slurm_cluster, "status", job, cwd=tmp_path)
    assert st.returncode == 0 and "COMPLETED" in st.stdout and str(run) in st.stdout, st.stdout
    logs = hp(slurm_cluster, "logs", job, cwd=tmp_path)
    assert "rank 0 on host n1" in logs.stdout
