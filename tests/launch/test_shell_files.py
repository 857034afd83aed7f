"""The batch shell is a library of bash files (src/hpctrain/launch/shell/): `bash -n` and
`shellcheck -S warning` pass on every file and on the scripts rendered from them for several site
shapes, the committed slurm/vit.sbatch included. A finding is fixed, or silenced on its line with the
reason: `# shellcheck disable=SCxxxx  # why`; no file silences a check file-wide.

A file alone is one part of the library: the job's state its functions share (hpctrain_signal,
hpctrain_decision, ...) is set in one part and read in another, so SC2154 (referenced, not assigned)
and SC2034 (assigned, unused) are checked where the parts come together, in every rendered script,
with every check on; each file alone is checked without those two."""

from __future__ import annotations

import ast
import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.launch import container, notebook
from hpctrain.launch.notebook import NotebookJob
from hpctrain.launch.sbatch import STEP_SRUN, JobPlan, render
from hpctrain.run.badnodes import NODE_NAME
from hpctrain.site.cluster_init import LMOD_INIT
from hpctrain.site.profile import load_profile
from hpctrain.site.runtimes import pyxis, sif
from hpctrain.site.runtimes.base import SRUN_VAR

ROOT = Path(__file__).resolve().parents[2]
SHELL = ROOT / "src" / "hpctrain" / "launch" / "shell"
FILES = sorted(SHELL.glob("*.sh"))
IMAGE = ["container.image=/images/x.sif"]
STAGE = ["container.stage_image=true", "container.stage_image_to=/local/${SLURMD_NODENAME}/$USER"]
COMMAND = '--output /r/%j_%t.out "${HPCTRAIN_PYTHON[@]}" -u -m hpctrain.launch.task /r/submitit'


def plan(profile: str, sets: list[str], **kw) -> JobPlan:
    base = dict(
        profile=load_profile(profile, sets),
        job_name="j",
        nodes=2,
        tasks_per_node=4,
        gpus_per_node=4,
        cpus_per_task=8,
        mem="0",
        time="01:00:00",
        binds=["/datasets", "/r/a,b"],
    )
    return JobPlan(**{**base, **kw})


# site shapes: each runtime, image staging, data staging, spares, a sweep's array, nsys, modules
SHAPES = {
    "local-none": plan("local", []),
    "ib-apptainer-staged-spares": plan(
        "example-ib", ["container.runtime=apptainer", *IMAGE, *STAGE], stage_to="$TMPDIR/stage", spare_nodes=1
    ),
    "roce-singularity-array": plan(
        "example-roce", ["container.runtime=singularity", *IMAGE], array="0-2%2", workdirs=["/r/a", "/r/b b", "/r/c'"]
    ),
    "ib-pyxis-staged-nsys": plan(
        "example-ib",
        ["container.runtime=pyxis", "container.image=/images/x.sqsh", *STAGE, "slurm.max_requeues=0"],
        binds=["/datasets"],
        nsys_ranks=[0, 5],
        nsys_dir="/r/run dir/profile",
    ),
}


@pytest.fixture(scope="module")
def shellcheck() -> str:
    path = shutil.which("shellcheck")
    assert path, "shellcheck is not installed: apt-get install shellcheck (.ci/run installs it)"
    return path


# the two checks a file alone cannot make (the module docstring): on for every rendered script
LIBRARY_WIDE = ("SC2154", "SC2034")


def findings(shellcheck: str, *paths: Path, exclude: tuple[str, ...] = ()) -> str:
    r = subprocess.run(
        [shellcheck, "-S", "warning", "-s", "bash", "-f", "gcc", *(["-e", ",".join(exclude)] if exclude else [])]
        + list(map(str, paths)),
        capture_output=True,
        text=True,
        # a cap, not a speed check: 9 rendered scripts took ~40 s here alone and over 120 s under load
        timeout=900,
    )
    return r.stdout + r.stderr


def unparsed(paths: list[Path]) -> list[str]:
    """`bash -n`'s complaint about each path that does not parse."""
    out = []
    for p in paths:
        r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True, timeout=30)
        if r.returncode:
            out.append(f"{p.name}: {r.stderr}")
    return out


def test_every_shell_file_parses_and_has_no_shellcheck_findings(shellcheck):
    assert len(FILES) >= 20, [f.name for f in FILES]
    assert not unparsed(FILES)
    out = findings(shellcheck, *FILES, exclude=LIBRARY_WIDE)
    assert out == "", f"shellcheck -S warning on launch/shell/:\n{out}"


def test_no_file_silences_a_check_file_wide_nor_the_library_wide_ones_at_all():
    """A directive before a file's first command covers the whole file (shellcheck's wiki, Directive);
    SC2154/SC2034 are not silenced on any line either: the rendered scripts show them all unneeded."""
    wide = [f.name for f in FILES if "disable=" in "".join(shellfile.text(f).split("# summary:")[0])]
    assert not wide, f"file-wide silences: {wide}"
    silenced = [
        f"{f.name}:{i}"
        for f in FILES
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if re.search(r"#\s*shellcheck\s.*disable=\S*(SC2154|SC2034)", line)
    ]
    assert not silenced, silenced


def test_every_shell_file_is_inlined_by_a_renderer():
    pkg = ROOT / "src" / "hpctrain"
    code = "\n".join(p.read_text() for p in [*(pkg / "launch").glob("*.py"), *(pkg / "site" / "runtimes").glob("*.py")])
    assert not [f.name for f in FILES if f'"{f.name}"' not in code]


def test_every_silenced_finding_says_why():
    """A directive that disables a check carries its reason after `  # `."""
    bare = [
        f"{f.name}:{i}: {line.strip()}"
        for f in FILES
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if re.search(r"#\s*shellcheck\s.*disable=", line) and not re.search(r"disable=\S+\s+#\s*\S", line)
    ]
    assert not bare, bare


def test_rendered_scripts_parse_and_have_no_shellcheck_findings(tmp_path, shellcheck):
    """Each site shape as `hpctrain submit` renders it and as a stand-alone script, and vit.sbatch."""
    paths = [ROOT / "slurm" / "vit.sbatch"]
    for name, p in SHAPES.items():
        standalone = dataclasses.replace(p, config="configs/x.yaml", overrides=["a=1"])
        for suffix, plan_, alone in (("", p, False), (".standalone", standalone, True)):
            paths.append(tmp_path / f"{name}{suffix}.sbatch")
            paths[-1].write_text(
                render(plan_, COMMAND, "/usr/bin/python3", alone, {"HPCTRAIN_LAUNCHER": "x"}, "/r/code/hpctrain")
            )
    paths.append(tmp_path / "notebook.sbatch")  # `hpctrain notebook`'s job, through a runtime
    paths[-1].write_text(notebook.batch_script(NotebookJob(image="/images/x.sif", workdir="/r/my notebooks")))
    assert not unparsed(paths)
    out = findings(shellcheck, *paths)
    assert out == "", f"shellcheck -S warning on the rendered scripts:\n{out}"


def test_per_node_and_per_task_programs_have_no_shellcheck_findings(tmp_path, shellcheck):
    """The programs the batch shell runs with `bash -c` on each node or for each task, values included."""
    programs = {
        "cleanenv": sif.cleanenv_wrapper(
            ["FOO", "BAR_*"], "~/stage/${SLURM_JOB_ID}", "SINGULARITYENV_", "/local/$USER"
        ),
        "image_env": pyxis.image_env_wrapper(["FOO"], "/opt/hpctrain-src"),
        "nsys": container.nsys_wrapper([0, 8], "/r/run dir/profile"),
        "stage_copy": sif.copy_program("/local/${SLURMD_NODENAME}"),
    }
    for name, text in programs.items():
        (tmp_path / f"{name}.sh").write_text(text)
    paths = sorted(tmp_path.glob("*.sh"))
    assert not unparsed(paths)
    out = findings(shellcheck, *paths)
    assert out == "", f"shellcheck -S warning on the per-task programs:\n{out}"


def test_values_reach_the_shell_as_the_python_side_has_them():
    """The constants a file repeats, and the header's quoting: control characters never reach a script."""
    assert LMOD_INIT in shellfile.text("module_init.sh")
    script = render(SHAPES["local-none"], "true", "python3", False)
    assert f"\n{shellfile.assign('hpctrain_node_name', NODE_NAME.pattern)}  # " in script
    assert shellfile.word("NAME_*") == '"NAME_*"' and shellfile.word("/a,b") == "'/a,b'"
    assert shellfile.word("it's $(x)") == "'it'\"'\"'s $(x)'"
    with pytest.raises(ValueError, match="control character"):
        shellfile.assign("x", "a\nb")
    with pytest.raises(ValueError, match="control character"):
        shellfile.assign_program("x", "a\x1b")


# Shell syntax in a Python string: the bash it marks belongs in launch/shell/ (checked by bash -n and
# shellcheck there), the Python side passing values only (shellfile.assign/array). Lines that are
# comments of the script are prose, not syntax.
SHELL_SYNTAX = {
    "if [": re.compile(r"\bif \["),
    "; then": re.compile(r";\s*then\b"),
    "fi": re.compile(r"(^|;)\s*fi\b"),
    "case": re.compile(r"\bcase \S+ in\b"),
    "esac": re.compile(r"\besac\b"),
    "for": re.compile(r"\bfor \w+ in\b"),
    "; do": re.compile(r";\s*do\b"),
    "done": re.compile(r"(^|;)\s*done\b"),
    "$(": re.compile(r"\$\("),
    "${": re.compile(r"\$\{"),
    "||": re.compile(r"\|\|"),
    "&&": re.compile(r"&&"),
}
# their bash is in launch/shell/ (and a runtime's beside it), values through shellfile
NO_BASH = (
    "launch/inplace.py",
    "launch/notebook.py",
    "site/fabric.py",
    "launch/modules.py",
    "launch/sbatch.py",
    "launch/pack_array.py",
    "launch/container.py",
    "launch/stage_image.py",
    *(f"site/runtimes/{name}.py" for name in ("apptainer", "singularity", "sif", "pyxis", "none")),
)  # (site/runtimes/__init__.py and base.py run detection's commands on the login node, not the batch shell)
# What the short dry run prints for the reader (not run): the PYTHONPATH none.sh sets, as an export.
SHOWN = {("none.py", "task_env")}


def bash_in_strings(path: Path) -> list[str]:
    """`file:line: marker: string` for each string constant (docstrings aside) whose non-comment lines
    hold shell syntax; f-strings count by their literal parts."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    allowed = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and (path.name, node.name) in SHOWN
        for sub in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings | allowed:
            continue
        code = [ln for ln in node.value.splitlines() if not ln.lstrip().startswith("#")]
        for marker, pattern in SHELL_SYNTAX.items():
            if any(pattern.search(ln) for ln in code):
                found.append(f"{path.name}:{node.lineno}: {marker}: {node.value!r}")
    return found


def test_no_bash_in_the_python_strings_of_the_batch_shells_renderers():
    """Their bash lives in launch/shell/; values reach it through the header's assignments. (Before the
    runtimes moved to site/runtimes/, container.py held 10 such strings; before the step loop became
    step_loop.sh's function, sbatch.step_loop wrote its loop and srun line.)"""
    found = [f for name in NO_BASH for f in bash_in_strings(ROOT / "src" / "hpctrain" / name)]
    assert not found, "bash in Python strings (move it to a launch/shell/*.sh file):\n" + "\n".join(found)


def test_the_step_loop_starts_the_step_as_the_short_dry_run_shows_it():
    """STEP_SRUN (the dry run's) and the runtime's srun array are the step_loop.sh's srun line."""
    text = shellfile.text("step_loop.sh")
    line = " ".join(ln.strip().rstrip("\\") for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    assert f"hpctrain_slurm -b {STEP_SRUN} " in line
    assert f'"${{{SRUN_VAR}[@]}}" "$@"' in line
