"""`hpctrain data pack --slurm`: pack the shard groups as the tasks of one Slurm array job.

Login-node code (no torch). The batch script follows the training job's conventions: `#SBATCH`
values from the cluster profile and the command line, refused when they hold a control character
and quoted; each task's Python is the profile's (`apptainer exec` with the data and output folders
bound, and the submitting hpctrain package, when the profile runs tasks in an image); modules as
the profile says. Task g runs `python -m hpctrain.data.prep.pack OUT g` (data/prep/pack.py says how a task
skips a finished group and how the last one writes the shard index).
"""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpctrain import shellfile
from hpctrain.config import check_text
from hpctrain.data.prep.pack import STATE, PackPlan, array_ranges
from hpctrain.errors import LaunchError
from hpctrain.launch import dryrun
from hpctrain.launch.container import bind_list, python_lines, task_words
from hpctrain.launch.enclosing import outside_job
from hpctrain.launch.modules import job_module_lines
from hpctrain.launch.sbatch import sbatch_value
from hpctrain.launch.submit import Request
from hpctrain.run.source import package_dir
from hpctrain.site.profile import ClusterProfile
from hpctrain.site.slurm_cli import ask, in_queue
from hpctrain.watch.follow import Pace

SCRIPT = "pack.sbatch"
JOB = "job"  # the last array job's id, under OUT/.pack


def script_path(out: Path) -> Path:
    return out / STATE / SCRIPT


def render(plan: PackPlan, root: str, profile: ClusterProfile, req: Request) -> str:
    """The array job's batch script (one task per shard group)."""
    req.check()
    out = plan.out.resolve()
    root = str(Path(root).resolve())
    for label, path in (("ROOT", root), ("OUT", str(out))):
        check_text(path, f"{label} (made absolute: {path!r})")
    s = profile.slurm
    pick = lambda a, b: b if a is None else a  # noqa: E731
    opts: list[tuple[str, object]] = [
        ("job-name", "hpctrain-pack"),
        ("array", f"0-{plan.groups - 1}"),
        ("ntasks", 1),
        ("time", req.time or s.time),
    ]
    for key in ("partition", "account", "qos", "constraint"):
        value = pick(getattr(req, key), getattr(s, key))
        if value:
            opts.append((key, value))
    opts += [("output", str(out / STATE / "logs" / "%A_%a.out")), ("open-mode", "append")]
    source = shlex.quote(str(package_dir())) if profile.container.bind_source else "''"
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# hpctrain data pack: {len(plan.shards)} shards of {root} into {out},",
        f"# {plan.groups} groups, one per array task (SLURM_ARRAY_TASK_ID = group).",
        "# A task whose group is packed already skips it: re-run failed groups with",
        f"#   sbatch --array=<groups> {script_path(out)}",
        "# or `hpctrain data pack ... --slurm` again (it submits the missing groups). The task",
        "# that finds every group done writes OUT/meta.json, the shard index.",
        *[sbatch_value(k, v) for k, v in opts],
        "",
        "set -eo pipefail",
        "",
        "# Python for the task: CONTAINER=apptainer|singularity|pyxis|none, HPCTRAIN_IMAGE=<image>, fixed",
        "# at submission (as for training; pyxis starts it through srun).",
        *python_lines(
            profile.container,
            binds(profile, root, out),
            q(sys.executable),
            source,
        ),
        "",
    ]
    mods = job_module_lines(profile.modules, profile.container_modules, profile.module_use, profile.module_purge)
    if mods:
        lines += [*mods, ""]
    lines += [
        shellfile.assign("hpctrain_groups", plan.groups),
        # hpctrain_slurm: the step's srun is a call to slurmctld, logged as the others
        *shellfile.lines("slurm_call.sh"),
        *shellfile.lines("pack_task.sh"),
        f"hpctrain_run {task_command(out)}",
        "",
    ]
    return "\n".join(lines)


def binds(profile: ClusterProfile, root: str, out: Path) -> list[str]:
    """The task reads ROOT and writes OUT (absolute paths)."""
    return bind_list(profile.container, [root, str(out)], writable=[str(out)])


def task_command(out: Path) -> str:
    """What each array task runs, after its Python ($HPCTRAIN_PYTHON's words)."""
    return f'{dryrun.PYTHON_HOOK} -u -m hpctrain.data.prep.pack {shlex.quote(str(out))} "$SLURM_ARRAY_TASK_ID"'


def brief(plan: PackPlan, root: str, profile: ClusterProfile, req: Request) -> str:
    """`data pack --slurm --dry-run`: the script's header, the task's environment, its command and a
    line per shell part (launch.dryrun); --dry-run=full prints `render`'s whole script."""
    with shellfile.recording() as inlined:
        script = render(plan, root, profile, req)
    c, out = profile.container, plan.out.resolve()
    source = str(package_dir()) if c.bind_source else ""
    srun, python = task_words(c, binds(profile, str(Path(root).resolve()), out), shlex.quote(sys.executable), source)
    step_srun = ["srun", "--ntasks=1", *srun] if srun else []  # srun options: srun starts the image (pyxis)
    steps = dryrun.step(step_srun, python, task_command(out))
    env = dryrun.environment(script, profile, source, step=False)
    return dryrun.assemble(script, inlined, env, steps, "Each array task's command (SLURM_ARRAY_TASK_ID: its group)")


def submit(out: Path, script: str, groups: list[int] | None = None) -> str:
    """Write the script under OUT/.pack and sbatch it (all groups, or `groups` only); the job id."""
    path = script_path(out)
    path.write_text(script)
    cmd = ["sbatch", "--parsable"]
    if groups is not None:
        cmd.append(f"--array={array_ranges(groups)}")  # the command line wins over the #SBATCH line
    if not shutil.which("sbatch"):
        raise LaunchError(
            "sbatch is not on PATH: run `data pack --slurm` on a login node of the "
            "cluster, or pack here with --workers N"
        )
    text, why = ask(*outside_job([*cmd, str(path)]), timeout=120)
    if text is None:
        raise LaunchError(f"sbatch refused the pack job: {why or 'no message'}")
    job = text.strip().split(";")[0]
    (out / STATE / JOB).write_text(job + "\n")
    return job


def recorded_job(out: Path) -> str | None:
    p = out / STATE / JOB
    if not p.is_file():
        return None
    return p.read_text().strip() or None


def job_queued(job: str) -> bool:
    """Some task of the array is still pending or running (squeue lists it)."""
    return in_queue(job)


def wait(job: str, pace: Pace | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
    """Until no task of the array is in the queue: squeue at the follower's pace (5, 15, 30 s, then
    every minute: watch/follow.py), not every 2 s for the hours a pack may take."""
    pace, n = pace or Pace(), 0
    while True:
        sleep(pace.gap(n))
        n += 1
        if not job_queued(job):
            return
