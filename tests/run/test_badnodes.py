"""The bad-node file the tasks write and the batch shell reads (hpctrain.run.badnodes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpctrain.run import badnodes


def test_reports_from_several_processes_are_whole_lines_read_back_in_order(tmp_path):
    f = tmp_path / "bad"
    env = {badnodes.ENV: str(f)}
    code = (
        "import sys; from hpctrain.run import badnodes; "
        "[badnodes.report(sys.argv[1], 'slow ' * 50) for _ in range(200)]"
    )
    # PYTHONPATH: the checkout's package (conftest), not an installed one
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, f"n{i}"],
            env={**env, "PATH": "/usr/bin", "PYTHONPATH": os.environ["PYTHONPATH"]},
        )
        for i in range(4)
    ]
    assert all(p.wait(60) == 0 for p in procs)
    lines = f.read_text().splitlines()
    assert len(lines) == 800 and all(line.split("\t")[1] == ("slow " * 50).strip() for line in lines)
    assert sorted(badnodes.read(f)) == ["n0", "n1", "n2", "n3"]
    # what the shell reads: the first field
    out = subprocess.run(["sh", "-c", f"cut -f1 '{f}' | sort -u"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["n0", "n1", "n2", "n3"]


def test_nothing_written_outside_a_batch_script_and_names_checked(tmp_path):
    assert badnodes.report("n1", "x", env={}) is False
    with pytest.raises(ValueError, match="not a node name"):
        badnodes.report("n1;rm -rf /", "x", env={badnodes.ENV: str(tmp_path / "bad")})
    assert badnodes.read(tmp_path / "missing") == {}
    assert badnodes.this_node({"SLURMD_NODENAME": "gpu017"}) == "gpu017"


def test_a_suspect_is_marked_for_the_shell_and_read_back_without_the_mark(tmp_path):
    env = {badnodes.ENV: str(tmp_path / "bad")}
    assert badnodes.report("n1", "rank 1 silent", env=env, suspect=True)
    assert badnodes.report("n2", "preflight: slow", env=env)
    assert (tmp_path / "bad").read_text() == "n1\trank 1 silent\tsuspect\nn2\tpreflight: slow\n"
    assert badnodes.read(tmp_path / "bad") == {"n1": "rank 1 silent", "n2": "preflight: slow"}


@pytest.mark.parametrize(
    "error, line",
    [
        (  # torch's C10_CUDA_CHECK text for cudaErrorECCUncorrectable
            "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            "gpu7\trank 3 failed: RuntimeError: CUDA error: uncorrectable ECC error encountered\n",
        ),
        (
            "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
            "gpu7\trank 3 failed: RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution\n",
        ),
        (  # torch 2.1's ProcessGroupNCCL text (NVIDIA/nccl#1016): the probe decides
            "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.18.1",
            "gpu7\trank 3 failed: DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system "
            "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1\tsuspect\n",
        ),
        ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", None),  # the job's, not the node's
        ("RuntimeError: CUDA error: device-side assert triggered", None),  # a bug
        ("ValueError: Xidden is not a key", None),
    ],
)
def test_errors_that_name_their_node_name_it(tmp_path, error, line):
    f = tmp_path / "bad"
    env = {badnodes.ENV: str(f), "SLURMD_NODENAME": "gpu7"}
    assert badnodes.report_error(error, 3, env) is (line is not None)
    assert (f.read_text() if f.exists() else None) == line
