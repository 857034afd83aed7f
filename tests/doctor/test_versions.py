"""doctor/versions.py: the versions that must fit together, on this machine and on a login node without torch."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib import metadata

import pytest

from hpctrain.doctor.report import format_report, run
from hpctrain.doctor.versions import driver_version, version_checks
from tests.doctor.fake_sysfs import write
from tests.helpers import hpctrain


@pytest.mark.slow
def test_this_machine_no_gpu_no_ib_and_versions():
    import torch

    r = hpctrain("doctor", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["gpus"] == [] and rep["ports"] == [] and rep["suggested_env"] == {} and rep["ok"] is True
    v = rep["versions"]
    assert v["python"] == platform.python_version() and v["torch"] == torch.__version__
    assert v["cuda"] is None and v["nccl"] is None and v["cudnn"] is None and v["torch_cuda_available"] is False
    assert v["dali"] == metadata.version("nvidia-dali-cuda120") and v["dali_package"] == "nvidia-dali-cuda120"
    text = format_report(run())
    assert "INFO  gpus" in text and "none visible" in text
    assert "none (no /sys/class/infiniband)" in text and f"{torch.__version__} (CPU build)" in text


def test_login_node_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from hpctrain.cli import main\n"
        "rc = main(['doctor', '--json'])\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
        "raise SystemExit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["versions"]["torch"] is None
    torch_check = next(c for c in rep["checks"] if c["name"] == "torch")
    assert torch_check["status"] == "info" and torch_check["value"] == "not installed"


def test_version_fit_rules(tmp_path):
    base = {
        "python": "3.11.7",
        "hpctrain": "0.1.0",
        "torch": "2.2.0",
        "cuda": "12.3",
        "cudnn": "8.9.7",
        "nccl": "2.19.3",
        "dali": "1.32.0",
        "dali_package": "nvidia-dali-cuda120",
        "driver": "470.82.01",
    }
    st = {c.name: c for c in version_checks(base, ["NVIDIA H100"])}
    assert st["driver"].status == "fail" and "needs driver ≥ 525.60" in st["driver"].hint
    st = {c.name: c for c in version_checks({**base, "driver": "535.104.05", "cuda": "11.8"}, ["A100"])}
    assert st["driver"].status == "ok" and st["dali"].status == "warn" and "CUDA 12" in st["dali"].hint
    st = {c.name: c for c in version_checks({**base, "cuda": None}, ["A100"])}
    assert st["torch"].status == "fail" and "CPU build" in st["torch"].hint
    st = {c.name: c for c in version_checks({**base, "torch_cuda_available": False}, ["A100"])}
    assert st["torch"].status == "fail" and "cannot use them" in st["torch"].hint
    st = {c.name: c for c in version_checks({**base, "torch_cuda_available": True}, ["A100"])}
    assert st["torch"].status == "ok" and st["nccl"].value == "2.19.3" and st["cudnn"].value == "8.9.7"
    two = {**base, "dali_package": "nvidia-dali-cuda110, nvidia-dali-cuda120", "dali": "1.30, 1.32"}
    assert {c.name: c for c in version_checks(two, [])}["dali"].status == "warn"
    write(
        tmp_path / "driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023",
    )
    assert driver_version(str(tmp_path)) == "535.104.05"
