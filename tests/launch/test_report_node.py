"""slurm.report_bad_node (launch/shell/report_node.sh): each node the batch shell leaves out reaches the
site's command as three arguments (node, evidence, job id) and/or a line of the site's file; a report
that fails or hangs is a warning, never the job's end. Run under bash as the script inlines it, with
`set -e` as the batch script has it where staging excludes a node."""

from __future__ import annotations

import getpass
import os
import subprocess
from pathlib import Path

from hpctrain import shellfile
from hpctrain.launch import inplace
from hpctrain.launch.sbatch import stop_lines
from hpctrain.site.profile import BadNodeReport

# what a task's report may hold: quotes, a command substitution, a tab and a newline
EVIDENCE = "n3: rank 1 failed: it's \"bad\" $(touch PWNED) `touch PWNED2`\tx\ny; n4: left the job's allocation"
CLEAN = EVIDENCE.replace("\t", "").replace("\n", "")  # control characters never reach a report


def exclude(tmp_path: Path, report: BadNodeReport) -> subprocess.CompletedProcess:
    """The shell's hpctrain_exclude_add for n3 and n4 with EVIDENCE, then `echo done`."""
    script = "\n".join(
        [
            "set -eo pipefail",
            *(parts := [*stop_lines(), *inplace.setup_lines(0, 1, 0, report)]),
            *shellfile.setup_calls(parts),
            'hpctrain_exclude_add "n3 n4" "$EVIDENCE"',
            "echo done",
        ]
    )
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "EVIDENCE": EVIDENCE}
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def site_command(tmp_path: Path, body: str) -> str:
    path = tmp_path / "report node"  # a space in the program's path, too
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_each_excluded_node_reaches_the_sites_command_and_file_with_its_evidence_and_job(tmp_path):
    cmd = site_command(tmp_path, f"printf '%s\\0' \"$@\" >> {tmp_path}/args")
    log = tmp_path / "admin" / "bad nodes.log"
    log.parent.mkdir()
    r = exclude(tmp_path, BadNodeReport(command=[cmd, "--site", "a b"], file=str(log)))
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    args = (tmp_path / "args").read_text().split("\0")[:-1]
    assert args == ["--site", "a b", "n3", CLEAN, "77", "--site", "a b", "n4", CLEAN, "77"]
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    assert [f[1:] for f in lines] == [["77", "n3", getpass.getuser(), CLEAN], ["77", "n4", getpass.getuser(), CLEAN]]
    assert all(f[0].endswith("Z") for f in lines)  # UTC time
    assert not list(tmp_path.glob("PWNED*"))  # the evidence is an argument, never read by a shell
    # and the exclusion itself, as before
    excluded = (tmp_path / ".hpctrain" / "excluded-77").read_text().splitlines()
    assert [line.split("\t")[1] for line in excluded] == ["n3", "n4"]


def test_a_report_that_fails_or_hangs_is_a_warning_and_the_job_goes_on(tmp_path):
    """A command that never ends is ended after timeout_s; a file that cannot be written, and a command
    that fails, are one warning each: under `set -e` the shell goes on and the nodes are left out."""
    hang = site_command(tmp_path, "exec sleep 300")
    r = exclude(tmp_path, BadNodeReport(command=[hang], file=str(tmp_path / "no such dir" / "log"), timeout_s=1))
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert r.stderr.count("slurm.report_bad_node.command failed for node") == 2, r.stderr
    assert "exit 124: no end in 1 s" in r.stderr and r.stderr.count("could not append node") == 2, r.stderr
    fail = site_command(tmp_path, "exit 5")
    r = exclude(tmp_path, BadNodeReport(command=[fail]))
    assert r.returncode == 0 and r.stdout == "done\n" and "(exit 5)" in r.stderr, r.stderr


def test_no_report_configured_runs_nothing(tmp_path):
    r = exclude(tmp_path, BadNodeReport())
    assert r.returncode == 0 and r.stdout == "done\n" and "report_bad_node" not in r.stderr, r.stderr
