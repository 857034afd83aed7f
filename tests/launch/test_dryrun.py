"""The short dry run (launch/dryrun.py): `--dry-run` shows the script's #SBATCH header, the tasks'
environment, the step command and a line per shell part, and what it shows is what the whole script
(`--dry-run=full`) gives srun; the other commands with a batch script take the same flag."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.launch.dryrun import exports, header
from hpctrain.run.source import take_snapshot
from tests.helpers import hpctrain
from tests.launch.jobs import digits_sets, hp, submit
from tests.launch.test_sbatch import HOSTILE, ROOT, blocked_cli, srun_seen

SHORT_MAX = 120  # lines of the short form of a 16-node job (the whole script: over 1,000)
FLAGS = ("--dry-run", "--dry-run=full")
RECIPE = ["--config", "configs/vit_b16_imagenet_4k.yaml", "--cluster", "example-ib", "--nodes", "16"]


def dry(*args: str, cwd: Path = ROOT) -> tuple[str, str]:
    """(short, full) dry runs of the 4k recipe on 16 nodes of example-ib, plus `args`."""
    short = blocked_cli("submit", *RECIPE, *args, "--dry-run", cwd=cwd)
    full = blocked_cli("submit", *RECIPE, *args, "--dry-run=full", cwd=cwd)
    assert short.returncode == 0 and full.returncode == 0, short.stderr + full.stderr
    assert short.stderr == full.stderr  # the notes and the plan summary, as before
    return short.stdout, full.stdout


def sections(short: str) -> dict[str, list[str]]:
    """The short form's parts: header, env, step, parts (each under its `# The ...` line)."""
    blocks = short.rstrip("\n").split("\n\n")
    assert len(blocks) == 4, short
    return dict(zip(("header", "env", "step", "parts"), (b.splitlines() for b in blocks)))


def test_short_dry_run_of_16_nodes_has_the_header_the_env_the_step_and_a_line_per_shell_part():
    short, full = dry()
    lines = short.splitlines()
    assert len(lines) < SHORT_MAX < len(full.splitlines()), len(lines)
    s = sections(short)
    assert s["header"] == header(full) and "#SBATCH --nodes=16" in s["header"]
    assert "#SBATCH --ntasks-per-node=8" in s["header"] and "#SBATCH --gpus-per-node=8" in s["header"]
    for line in (
        "export NCCL_IB_TIMEOUT=22",
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3",
        "export OMP_NUM_THREADS=8",
        "export SLURM_EXPORT_ENV=ALL",
        "export APPTAINERENV_PYTHONNOUSERSITE=1",
        "# Unset, so NCCL chooses: NCCL_IB_HCA, NCCL_SOCKET_IFNAME, NCCL_IB_GID_INDEX.",
    ):
        assert line in s["env"], line
    assert any(ln.startswith("# modules: module load apptainer ") for ln in s["env"]), s["env"]
    assert any("cuda/12.4 nccl/2.21" in ln and "CONTAINER=none" in ln for ln in s["env"]), s["env"]
    assert s["step"][1].startswith("srun --kill-on-bad-exit=1 --unbuffered --open-mode=append --cpu-bind=cores")
    step = " ".join(ln.rstrip("\\").strip() for ln in s["step"][1:])
    assert "apptainer exec --nv --cleanenv --bind /datasets" in step and "/opt/hpctrain-src/hpctrain:ro" in step
    assert "/shared/images/hpctrain-pytorch-23.12.sif python3 -u -m hpctrain.launch.task" in step
    # one line per shell part the script inlines, each named with its summary; every one of them is in it
    parts = s["parts"][1:]
    names = [ln.split()[0] for ln in parts]
    assert len(set(names)) == len(names) > 20 and {"stops.sh", "ctld.sh", "step_wait.sh", "cleanenv.sh"} <= set(names)
    for name, line in zip(names, parts):
        assert line.split(None, 1)[1] == shellfile.summary(name)
        assert "\n".join(ln.strip() for ln in shellfile.lines(name)[-3:]) in "\n".join(
            ln.strip() for ln in full.splitlines()
        ), name  # inlined (a per-task program quotes its lines: compare their ends, unindented)


@pytest.mark.parametrize("name", ["r", HOSTILE])
def test_what_the_short_form_shows_is_what_srun_gets_from_the_whole_script(tmp_path, name):
    """The whole script run by bash to its step (a stand-in srun records its argv and environment):
    the short form's step command is srun's command line word for word (the per-task program by its
    name), and each of its exports has the value the tasks get; also for a run named with quotes,
    `$(…)` and `;` (no command of it runs)."""
    image = tmp_path / "image.sif"
    image.write_bytes(b"fake")
    runs = tmp_path / "runs"
    sets = ["--cluster-set", f"container.image={image}", "--set", f"run.dir={runs}", "--set", f"run.name={name}"]
    short, full = dry(*sets, cwd=tmp_path)
    take_snapshot(runs / name)  # where the script (fixed at submission) finds the code
    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    (work / "bin" / "apptainer").write_text("#!/bin/sh\n")  # the runtime on PATH (no module system needed)
    (work / "bin" / "apptainer").chmod(0o755)
    args, env = srun_seen(full, work)
    step = "\n".join(sections(short)["step"][1:])
    words = shlex.split(step.replace("\\\n", " "))
    seen = ["$hpctrain_cleanenv" if i and args[i - 1] == "-c" else a for i, a in enumerate(args)]
    assert words == ["srun", *seen], (words, seen)
    shown = "\n".join(ln for ln in sections(short)["env"] if ln.startswith("export "))
    names = re.findall(r"^export (\w+)=", shown, re.M)
    probe = f'{shown}\nfor n in {" ".join(names)}; do printf "%s=%s\\0" "$n" "${{!n}}"; done'
    got = subprocess.run(["bash", "-c", probe], cwd=work, env={"SLURM_JOB_ID": "42"}, capture_output=True, text=True)
    values = dict(kv.split("=", 1) for kv in got.stdout.split("\0") if kv)
    assert len(names) > 20 and all(values[n] == env[n] for n in names), {
        n: (values[n], env.get(n)) for n in names if values[n] != env.get(n)
    }
    assert not list(tmp_path.rglob("PWNED*"))


def test_every_export_of_the_short_form_is_a_line_of_the_whole_script():
    short, full = dry()
    lines = set(full.splitlines())
    for line in exports(full):
        assert line in short
        name = line.split("=", 1)[0].removeprefix("export ")
        # at the top level, or in a part's setup function (one level in)
        assert {line, f"  {line}", f"export {name}", f"  export {name}"} & lines, line


@pytest.mark.parametrize("runtime", ["pyxis", "none", "singularity"])
def test_the_step_of_each_runtime_is_srun_word_for_word(tmp_path, runtime):
    """As above for the other runtimes: pyxis's srun options (mounts, workdir), the host's Python."""
    image = tmp_path / ("image.sqsh" if runtime == "pyxis" else "image.sif")
    image.write_bytes(b"fake")
    runs = tmp_path / "runs"
    sets = ["--cluster-set", f"container.runtime={runtime}", "--cluster-set", f"container.image={image}"]
    sets += ["--cluster-set", "container_modules=[]", "--cluster-set", "modules=[]"]
    sets += ["--set", f"run.dir={runs}", "--set", "run.name=r"]
    short, full = dry(*sets, cwd=tmp_path)
    take_snapshot(runs / "r")
    args, env = srun_seen(full, runs / "r")  # in the script's --chdir, which pyxis mounts as $PWD
    step = "\n".join(sections(short)["step"][1:]).replace("\\\n", " ")
    prog = {"pyxis": "$hpctrain_imageenv", "singularity": "$hpctrain_cleanenv"}.get(runtime)
    seen = [prog if i and args[i - 1] == "-c" else a for i, a in enumerate(args)]
    assert shlex.split(step) == ["srun", *seen], (step, seen)
    if runtime == "none":
        assert f"export PYTHONPATH={runs / 'r' / 'code'}" in short.replace("'", "")


def test_full_dry_run_is_the_script_and_the_flag_takes_no_other_value():
    short, full = dry()
    assert full.startswith("#!/bin/bash\n") and "\nhpctrain_step_loop " in full
    assert subprocess.run(["bash", "-n"], input=full, text=True).returncode == 0
    bad = blocked_cli("submit", *RECIPE, "--dry-run=short-ish")
    assert bad.returncode == 2 and "invalid choice: 'short-ish' (choose from 'short', 'full')" in bad.stderr


def test_sweep_eval_and_pack_take_the_same_flag(tmp_path, digits_root):
    """sweep, eval --nodes, data pack --slurm: --dry-run short, --dry-run=full the whole script; the
    notebook's script is short already: both print it."""
    runs = ["--set", f"run.dir={tmp_path}/runs"]
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    commands = {
        "sweep": ["sweep", *RECIPE, *runs, "--grid", "optim.lr=1e-3,2e-3"],
        "eval": ["eval", "--weights", str(weights), "-o", str(tmp_path / "ev"), *RECIPE],
        "pack": ["data", "pack", str(digits_root), str(tmp_path / "packed"), "--slurm", "--cluster", "example-ib"],
    }
    for name, argv in commands.items():
        short = blocked_cli(*argv, "--dry-run", cwd=tmp_path)
        full = blocked_cli(*argv, "--dry-run=full", cwd=tmp_path)
        assert short.returncode == 0 and full.returncode == 0, name + short.stderr + full.stderr
        s = sections(short.stdout)
        assert s["header"] == header(full.stdout) and len(short.stdout.splitlines()) < SHORT_MAX, name
        assert "-m hpctrain." in "\n".join(s["step"]) and s["parts"][0].startswith("# The shell parts"), name
        assert len(full.stdout.splitlines()) > 2 * len(short.stdout.splitlines()), name
    nb = [hpctrain("notebook", "--cluster", "example-ib", "--port", "23456", f, cwd=tmp_path) for f in FLAGS]
    assert nb[0].stdout == nb[1].stdout and "#SBATCH --job-name=" in nb[0].stdout


def test_every_shell_part_has_a_one_line_summary_that_is_not_inlined():
    for f in sorted((ROOT / "src" / "hpctrain" / "launch" / "shell").glob("*.sh")):
        summary = shellfile.summary(f.name)
        assert 10 < len(summary) < 120 and not any(shellfile.SUMMARY in ln for ln in shellfile.lines(f.name))


@pytest.mark.slurm
def test_full_dry_run_is_the_script_sbatch_gets(slurm_cluster, digits_root, tmp_path):
    """`--dry-run=full` prints the script a submission of the same command hands to sbatch, byte for
    byte (slurmctld's copy: `scontrol write batch_script`). `--emit-sbatch` writes the stand-alone
    script instead (environment hooks, `python3 -m hpctrain train`): test_sbatch.py checks that one."""
    args = ["--config", "configs/digits_vit.yaml", *digits_sets(digits_root, tmp_path, "full", "train.max_steps=1")]
    dry = hp(slurm_cluster, "submit", *args, "--dry-run=full")
    assert dry.returncode == 0, dry.stderr
    job = submit(slurm_cluster, *args[2:])
    try:
        script = slurm_cluster.run("scontrol", "write", "batch_script", job, "-").stdout
    finally:
        slurm_cluster.run("scancel", job, check=False)
    assert script == dry.stdout
