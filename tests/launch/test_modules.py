"""The batch script's module lines (launch/modules.py) run by bash: after the container modules load,
the runtime whose command starts each task (the registry's `command`) must be on PATH, or the job
stops with the fix; a runtime srun starts (pyxis) is not looked for."""

from __future__ import annotations

import subprocess

import pytest

from hpctrain.launch.modules import job_module_lines


def run_modules(tmp_path, container: str) -> subprocess.CompletedProcess:
    """The module lines of a profile with container_modules [apptainer/1.3], under a stand-in `module`
    that loads nothing, on a PATH without any runtime."""
    script = "\n".join(
        [
            f"CONTAINER={container}",
            'module() { echo "module $*" >&2; }',
            *job_module_lines(["cuda/12"], ["apptainer/1.3"]),
            "echo reached",
        ]
    )
    env = {"PATH": "/usr/bin:/bin", "LMOD_CMD": "", "MODULESHOME": ""}
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("runtime", ["apptainer", "singularity"])
def test_a_runtime_whose_command_is_not_on_path_after_its_modules_stops_the_job(tmp_path, runtime):
    r = run_modules(tmp_path, runtime)
    assert r.returncode == 1 and "reached" not in r.stdout
    assert (
        f"hpctrain: {runtime} is not on PATH, and HPCTRAIN_CONTAINER_MODULES=apptainer/1.3 did not put it" in r.stderr
    )
    assert "module load apptainer/1.3" in r.stderr


@pytest.mark.parametrize("runtime", ["pyxis", "none"])
def test_a_runtime_without_a_command_of_its_own_is_not_looked_for(tmp_path, runtime):
    r = run_modules(tmp_path, runtime)
    assert r.returncode == 0 and "reached" in r.stdout, r.stderr
