"""The batch script: the committed slurm/vit.sbatch is the generator's output; dry runs need no
torch; values from configs and profiles are quoted."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from hpctrain.run.source import source_hash, take_snapshot

ROOT = Path(__file__).resolve().parents[2]
EMIT = [
    "submit",
    "--config",
    "configs/vit_b16_imagenet_4k.yaml",
    "--cluster",
    "example-ib",
    "--nodes",
    "16",
    "--gpus-per-node",
    "8",
    "--emit-sbatch",
    "slurm/vit.sbatch",
]

# Run the CLI where `import torch` (or DALI, numpy, PIL) raises, as on a login node without them.
BLOCKED = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'nvidia', 'torchvision', 'numpy', 'PIL'):
            raise ImportError(f'{name} is blocked in this test (login node)')
sys.meta_path.insert(0, Block())
sys.argv = ['hpctrain', *sys.argv[1:]]
runpy.run_module('hpctrain', run_name='__main__')
"""


def blocked_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_committed_sbatch_is_the_generators_output(tmp_path):
    (tmp_path / "slurm").mkdir()
    r = blocked_cli(*EMIT, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    fresh = (tmp_path / "slurm" / "vit.sbatch").read_text()
    committed = (ROOT / "slurm" / "vit.sbatch").read_text()
    assert fresh == committed, (
        f"slurm/vit.sbatch differs from the generator: regenerate it with `hpctrain {' '.join(EMIT)}`"
    )
    assert subprocess.run(["bash", "-n", str(ROOT / "slurm" / "vit.sbatch")]).returncode == 0
    assert (  # the job's main lines: the step loop's srun (step_loop.sh) with this binding and command
        "\nhpctrain_step_bind=(--cpu-bind=cores --gpu-bind=none)\n"
        'hpctrain_step_loop "${HPCTRAIN_PYTHON[@]}" -m hpctrain train\n'
        "hpctrain_requeue_or_end\n"
    ) in fresh


def test_dry_run_16_nodes_without_torch():
    r = blocked_cli(
        "submit",
        "--nodes",
        "16",
        "--gpus-per-node",
        "8",
        "--cluster",
        "configs/clusters/example-ib.yaml",
        "--dry-run=full",
    )
    assert r.returncode == 0, r.stderr
    s = r.stdout
    for line in (
        "#SBATCH --nodes=16",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --signal=B:USR2@300",
        "module load $hpctrain_modules",
        "HPCTRAIN_MODULES=${HPCTRAIN_MODULES-'cuda/12.4 nccl/2.21'}",
        "HPCTRAIN_CONTAINER_MODULES=${HPCTRAIN_CONTAINER_MODULES-apptainer}",
        "apptainer exec --nv --cleanenv --bind /datasets",
        "hpctrain_prefix=APPTAINERENV_",  # sif.sh exports ${prefix}PYTHONNOUSERSITE=1 (moved from the line itself)
        "hpctrain_mount=/opt/hpctrain-src",  # sif.sh binds $HPCTRAIN_SOURCE at $hpctrain_mount/hpctrain, read-only
        "export HPCTRAIN_SOURCE_HASH=",
        "export HPCTRAIN_SUBMITIT_VERSION=",
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3",  # fixed at submission (slurm/vit.sbatch: the env wins)
        "srun --kill-on-bad-exit=1",
        "-u -m hpctrain.launch.task",
        "export HPCTRAIN_MAX_PREEMPTIONS=-1",
        "trap 'hpctrain_pass TERM' TERM",
        'scontrol requeue "$hpctrain_job"',
    ):
        assert line in s, line
    assert "module purge" not in s
    # left to NCCL: the GPU-near HCAs, an interface, the RoCE GID (profiles name them when needed)
    assert not [
        ln
        for ln in s.splitlines()
        if ln.startswith("export ") and any(v in ln for v in ("NCCL_IB_HCA", "SOCKET_IFNAME", "NCCL_IB_GID_INDEX"))
    ]
    assert "# Unset, so NCCL chooses: NCCL_IB_HCA, NCCL_SOCKET_IFNAME, NCCL_IB_GID_INDEX." in s
    assert "image '/shared/images/hpctrain-pytorch-23.12.sif' does not exist" in r.stderr  # a note only
    assert subprocess.run(["bash", "-n"], input=s, text=True).returncode == 0


HOSTILE = 'it\'s a "run" $(touch PWNED) `touch PWNED2`; touch PWNED3 & x'


def test_hostile_values_are_quoted_in_the_script(tmp_path):
    """Render with hostile values, then run the script's setup (everything but srun) in bash:
    no command runs and each value arrives intact in the environment."""
    prof = tmp_path / "evil.yaml"
    import yaml

    prof.write_text(
        yaml.safe_dump(
            {
                "slurm": {"request_gpus": False, "gpus_per_node": 1},
                "env": {"HPCTRAIN_EVIL": HOSTILE},
                "container": {"binds": [f"/data/{HOSTILE}"], "runtime": "apptainer", "image": __file__},
            }
        )
    )
    run_dir = tmp_path / HOSTILE
    r = blocked_cli(
        "submit",
        "--config",
        "digits_vit.yaml",
        "--cluster",
        str(prof),
        "--dry-run=full",
        "--set",
        f"run.dir={run_dir}",
        "--set",
        f"run.name={HOSTILE}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    script = r.stdout
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    snap = run_dir / HOSTILE / "code" / source_hash() / "hpctrain"  # where a submission puts the code
    assert f"\nHPCTRAIN_SOURCE={shlex.quote(str(snap))}\n" in script
    assert not run_dir.exists()  # a dry run writes no snapshot (nor anything else)
    snap.mkdir(parents=True)
    setup = script.split("\nhpctrain_step_loop ")[0]  # the script up to the steps (step_loop.sh)
    probe = setup + '\nprintf "%s\\0" "$HPCTRAIN_EVIL" "${HPCTRAIN_PYTHON[@]}" > values.bin\n'
    out = subprocess.run(
        ["bash", "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    values = (tmp_path / "values.bin").read_text().split("\0")
    assert values[0] == HOSTILE
    assert f"/data/{HOSTILE}" in values and __file__ in values
    assert f"{snap}:/opt/hpctrain-src/hpctrain:ro" in values
    assert not list(tmp_path.glob("PWNED*"))
    assert f"#SBATCH --job-name={HOSTILE}" not in script  # quoted for sbatch's own parser


def test_committed_script_reaches_srun_from_any_directory(tmp_path):
    """Run slurm/vit.sbatch with bash (a stand-in `srun` that records its arguments) from a directory
    that is not a checkout, with no image: every line before srun must pass under `set -e`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    (bindir / "srun").chmod(0o755)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "CONTAINER": "none",
        "HPCTRAIN_MODULES": "",
        "SRUN_ARGS": str(tmp_path / "srun.args"),
    }
    r = subprocess.run(
        ["bash", str(ROOT / "slurm" / "vit.sbatch")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[:3] == ["--kill-on-bad-exit=1", "--unbuffered", "--open-mode=append"] and args[-3:] == [
        "-m",
        "hpctrain",
        "train",
    ]
    assert (tmp_path / ".hpctrain").is_dir()


def run_committed_script(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """slurm/vit.sbatch under bash with a stand-in `srun` that records its arguments (in srun.args)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    (bindir / "srun").chmod(0o755)
    base = {"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SRUN_ARGS": str(tmp_path / "srun.args")}
    return subprocess.run(
        ["bash", str(ROOT / "slurm" / "vit.sbatch")],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_committed_script_says_which_overrides_reached_it(tmp_path):
    """The header's overrides are said at the start; a job submitted with --export=NONE (a site's
    SBATCH_EXPORT=NONE: SLURM_EXPORT_ENV=NONE in the batch environment, tests/launch/test_sites.py)
    says that the user's exported ones cannot reach it, and how to pass them."""
    r = run_committed_script(tmp_path, CONTAINER="none", HPCTRAIN_MODULES="", HPCTRAIN_CONFIG="configs/digits_vit.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == (
        "hpctrain: overrides from the environment: CONTAINER=none HPCTRAIN_CONFIG=configs/digits_vit.yaml "
        "HPCTRAIN_MODULES="
    )
    assert "--export=NONE" not in r.stderr
    r = run_committed_script(tmp_path, SLURM_EXPORT_ENV="NONE")  # the 16-node defaults: the image is not here
    assert r.stdout.splitlines()[0] == "hpctrain: overrides from the environment: none (the defaults below run)"
    (none,) = [line for line in r.stderr.splitlines() if "--export=NONE" in line]
    assert "cannot reach it; pass them with sbatch --export=ALL (or --export=ALL,HPCTRAIN_CONFIG=<file>)" in none


def test_committed_script_refuses_spares_without_no_kill(tmp_path):
    """HPCTRAIN_SPARE_NODES on a script rendered without #SBATCH --no-kill: a node failure would still
    end the job, so the spares would only cost; refused before any step (a batch shell cannot tell an
    `sbatch --no-kill` from the command line: docs/spares.md)."""
    nodes = {"SLURM_JOB_NUM_NODES": "18", "SLURM_JOB_NODELIST": "n[1-18]", "SLURM_NTASKS_PER_NODE": "8"}
    r = run_committed_script(tmp_path, CONTAINER="none", HPCTRAIN_MODULES="", HPCTRAIN_SPARE_NODES="2", **nodes)
    assert r.returncode == 1 and not (tmp_path / "srun.args").exists(), r.stdout + r.stderr
    (line,) = r.stderr.splitlines()
    assert "HPCTRAIN_SPARE_NODES=2, but this script has no #SBATCH --no-kill" in line
    assert "render it with --spare-nodes 2" in line
    r = run_committed_script(tmp_path, CONTAINER="none", HPCTRAIN_MODULES="", HPCTRAIN_SPARE_NODES="0")
    assert r.returncode == 0, r.stdout + r.stderr


def test_sbatch_template_writes_the_shipped_script_anywhere(tmp_path):
    from tests.helpers import hpctrain

    r = hpctrain("sbatch-template", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("wrote vit.sbatch: submit it with `sbatch vit.sbatch`"), r.stderr
    assert (tmp_path / "vit.sbatch").read_bytes() == (ROOT / "slurm" / "vit.sbatch").read_bytes()
    again = hpctrain("sbatch-template", cwd=tmp_path)
    assert again.returncode == 2 and again.stderr == (
        "hpctrain: error: vit.sbatch already exists: pass --force to overwrite it, or give another path\n"
    )
    (tmp_path / "jobs").mkdir()
    assert hpctrain("sbatch-template", "jobs", cwd=tmp_path).returncode == 0
    assert (tmp_path / "jobs" / "vit.sbatch").is_file()
    assert hpctrain("sbatch-template", "-").stdout == (ROOT / "slurm" / "vit.sbatch").read_text()


def test_login_nodes_small_locked_memory_limit_is_raised_to_the_nodes_hard_limit():
    """Slurm applies the submitting shell's soft `ulimit -l` to the job (PropagateResourceLimits);
    the script's lines raise it as far as the node's hard limit allows (real bash, real limits)."""
    import subprocess

    from hpctrain.launch.sbatch import MEMLOCK_LINES

    lines = "\n".join(MEMLOCK_LINES)
    node = subprocess.run(["bash", "-c", "ulimit -H -l"], capture_output=True, text=True).stdout.strip()
    for hard in (node, "1024"):  # this machine's hard limit (unlimited or not), and a lower one
        r = subprocess.run(
            ["bash", "-c", f"set -eo pipefail; ulimit -S -l 64; ulimit -H -l {hard}\n{lines}\nulimit -S -l"],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0 and r.stdout.strip() == hard, (hard, r.stdout, r.stderr)


def test_emit_sbatch_notes_what_a_dry_run_notes_and_its_header_names_its_own_path(tmp_path):
    """`--emit-sbatch job.sbatch` printed none of the dry run's notes (a missing data root, a missing
    image, the plan) and its header said `sbatch slurm/vit.sbatch` and that a test keeps the file
    equal to the generator's output: true of the shipped script only."""
    args = ["submit", "--config", "configs/vit_b16_imagenet_4k.yaml", "--cluster", "example-ib"]
    args += ["--nodes", "16", "--gpus-per-node", "8", "--set", f"data.root={tmp_path / 'nowhere'}"]
    dry = blocked_cli(*args, "--dry-run", cwd=ROOT)
    emit = blocked_cli(*args, "--emit-sbatch", "job.sbatch", cwd=tmp_path)
    assert dry.returncode == 0 and emit.returncode == 0, dry.stderr + emit.stderr

    def said(text: str) -> list[str]:  # the notes, warnings and plan lines, wherever printed
        return sorted(ln for ln in text.splitlines() if ln.startswith(("hpctrain: note:", "hpctrain: warning:")))

    notes = said(dry.stderr)
    assert any("data.root=" in n for n in notes) and any("container.image" in n for n in notes), notes
    assert said(emit.stdout + emit.stderr) == notes
    plan = [ln for ln in dry.stderr.splitlines() if ln.startswith("hpctrain:   ")]
    assert plan and all(ln in emit.stdout for ln in plan)
    assert emit.stdout.rstrip().endswith("submit it with `sbatch job.sbatch`")
    header = (tmp_path / "job.sbatch").read_text().split("\n#SBATCH", 1)[0]
    assert "# Run as is:  sbatch job.sbatch\n" in header and "#   job.sbatch\n" in header
    assert "slurm/vit.sbatch" not in header and "a test" not in header


def test_where_the_mtbf_came_from_is_exported_quoted_not_put_in_the_config(tmp_path):
    """ckpt.every=auto: submit resolves ckpt.mtbf_h into the config and exports where it came from
    (HPCTRAIN_MTBF_SOURCE, for env.json); a profile's name with a quote arrives intact."""
    import yaml

    prof = tmp_path / "it's $(touch PWNED).yaml"
    prof.write_text(yaml.safe_dump({"slurm": {"request_gpus": False, "gpus_per_node": 1, "node_mtbf_hours": 500}}))
    r = blocked_cli(
        "submit", "--config", "digits_vit.yaml", "--cluster", str(prof), "--nodes", "2", "--dry-run",
        "--set", "ckpt.every=auto", "--set", f"run.dir={tmp_path}", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("export HPCTRAIN_MTBF_SOURCE=")]
    got = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$HPCTRAIN_MTBF_SOURCE"'], capture_output=True, text=True)
    assert got.stdout == "slurm.node_mtbf_hours=500 (profile it's $(touch PWNED)) / 2 nodes", got
    assert not list(tmp_path.glob("PWNED*"))
    plain = blocked_cli("submit", "--config", "digits_vit.yaml", "--cluster", str(prof), "--dry-run", cwd=tmp_path)
    assert plain.returncode == 0 and "HPCTRAIN_MTBF_SOURCE" not in plain.stdout  # a fixed interval: nothing to say


def srun_seen(script: str, cwd: Path, **exported: str) -> tuple[list[str], dict[str, str]]:
    """Run a batch script with bash, `exported` in its environment, to its first srun (a stand-in
    that records its arguments and environment, then fails the step): (srun's argv, its environment)."""
    bindir = cwd / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > srun.args\nenv -0 > srun.env\n')
    (bindir / "srun").chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "HPCTRAIN_MODULES": "", **exported}
    r = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert (cwd / "srun.args").is_file(), r.stdout + r.stderr
    args = (cwd / "srun.args").read_text().split("\0")[:-1]
    seen = dict(kv.split("=", 1) for kv in (cwd / "srun.env").read_text().split("\0") if "=" in kv)
    return args, seen


def test_the_submitting_shells_variables_change_nothing_in_a_submitted_job(tmp_path):
    """Issue 54: the script `hpctrain submit` hands to sbatch said HPCTRAIN_SOURCE=${HPCTRAIN_SOURCE-...}
    (and so for CONTAINER, HPCTRAIN_IMAGE, the fabric's NCCL_*): a user who once exported one ran other
    code or another image, and failed on the hash after the allocation. Now those are fixed at
    submission; slurm/vit.sbatch, run from the same environment, still takes them."""
    import yaml

    image, other = tmp_path / "image.sif", tmp_path / "other.sif"
    image.write_bytes(b"fake")
    other.write_bytes(b"other")
    prof = tmp_path / "site.yaml"
    fabric = {"kind": "ib", "ib_timeout": 20}
    container = {"runtime": "apptainer", "image": str(image)}
    prof.write_text(
        yaml.safe_dump({"name": "site", "slurm": {"request_gpus": False}, "fabric": fabric, "container": container})
    )
    runs = tmp_path / "runs"
    r = blocked_cli(
        "submit", "--cluster", str(prof), "--dry-run=full", "--set", f"run.dir={runs}", "--set", "run.name=r"
    )
    assert r.returncode == 0, r.stderr
    snap = take_snapshot(runs / "r")  # where the dry run's script finds the code, as a submission leaves it
    frozen = tmp_path / "frozen" / "hpctrain"
    frozen.mkdir(parents=True)
    exported = {
        "CONTAINER": "none",
        "HPCTRAIN_IMAGE": str(other),
        "HPCTRAIN_SOURCE": str(frozen),
        "NCCL_IB_TIMEOUT": "7",
        "NCCL_IB_DISABLE": "1",
    }
    work = tmp_path / "work"
    work.mkdir()
    plain = srun_seen(r.stdout, work)
    args, env = srun_seen(r.stdout, work, **exported)
    assert args == plain[0] and "PYTHONPATH" not in env  # the same srun line, the image's Python
    assert f"{snap.path}:/opt/hpctrain-src/hpctrain:ro" in args and str(image) in args and str(other) not in args
    assert env["HPCTRAIN_SOURCE"] == str(snap.path) and env["HPCTRAIN_IMAGE"] == str(image)
    assert (env["CONTAINER"], env["NCCL_IB_TIMEOUT"], env["NCCL_IB_DISABLE"]) == ("apptainer", "20", "0")
    # the stand-alone script honours the same environment (its documented hooks)
    script = (ROOT / "slurm" / "vit.sbatch").read_text()
    args, env = srun_seen(script, work, **exported)
    assert args[-3:] == ["-m", "hpctrain", "train"] and "apptainer" not in args and str(other) not in args
    assert env["PYTHONPATH"].split(":")[0] == str(frozen.parent) and env["HPCTRAIN_SOURCE"] == str(frozen)
    assert (env["NCCL_IB_TIMEOUT"], env["NCCL_IB_DISABLE"], env["HPCTRAIN_IMAGE"]) == ("7", "1", str(other))


def test_a_submitted_script_logs_its_slurm_calls_where_the_submitting_shell_said(tmp_path, monkeypatch):
    """$HPCTRAIN_SLURM_CALL_LOG (the call log bench/site_load.py reads) is fixed in a submitted script
    as an absolute path: the batch shell (ctld.sh) logs to the same file even from another directory
    or where sbatch exports no environment; unset, the script names none; a control character in it is
    one line of error."""
    monkeypatch.setenv("HPCTRAIN_SLURM_CALL_LOG", "logs/calls.jsonl")
    args = ("submit", "--cluster", "example-ib", "--dry-run", "--set", f"run.dir={tmp_path}")
    r = blocked_cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"export HPCTRAIN_SLURM_CALL_LOG={tmp_path}/logs/calls.jsonl\n" in r.stdout
    monkeypatch.delenv("HPCTRAIN_SLURM_CALL_LOG")
    plain = blocked_cli(*args, cwd=tmp_path)
    assert plain.returncode == 0 and "export HPCTRAIN_SLURM_CALL_LOG" not in plain.stdout, plain.stderr
    monkeypatch.setenv("HPCTRAIN_SLURM_CALL_LOG", "calls\x1b.jsonl")
    bad = blocked_cli(*args, cwd=tmp_path)
    (err,) = [ln for ln in bad.stderr.splitlines() if "error:" in ln]  # after the plan's notes
    assert bad.returncode == 2 and "HPCTRAIN_SLURM_CALL_LOG=" in err and "\x1b" not in bad.stderr, bad.stderr
