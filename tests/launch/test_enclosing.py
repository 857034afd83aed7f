"""The rule for submitting from inside a job (launch/enclosing.py); the job itself runs in
tests/launch/test_sites.py::test_submission_from_inside_an_allocation_runs_with_its_own_resources."""

from __future__ import annotations

from hpctrain.launch.enclosing import outside_job


def test_inside_a_job_sbatch_runs_without_its_settings_and_says_so(capsys):
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_MEM_PER_CPU": "100",
        "SRUN_CPUS_PER_TASK": "2",
        "SLURM_CONF": "/etc/s.conf",
        "SBATCH_ACCOUNT": "proj",
        "PATH": "/bin",
    }
    argv = outside_job(["sbatch", "x.sh"], env)
    assert argv == [
        "env",
        "-u",
        "SLURM_JOB_ID",
        "-u",
        "SLURM_MEM_PER_CPU",
        "-u",
        "SRUN_CPUS_PER_TASK",
        "sbatch",
        "x.sh",
    ]
    err = capsys.readouterr().err
    assert "inside Slurm job 7" in err and "kept: SBATCH_ACCOUNT, SLURM_CONF" in err and err.count("\n") == 1


def test_outside_a_job_sbatch_runs_as_is(capsys):
    env = {"SLURM_CONF": "/etc/s.conf", "SRUN_CPUS_PER_TASK": "2"}  # no SLURM_JOB_ID: a login shell
    assert outside_job(["sbatch", "x.sh"], env) == ["sbatch", "x.sh"]
    assert capsys.readouterr().err == ""
