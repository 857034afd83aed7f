"""doctor/site_fit.py: `doctor --cluster P` checks this node against what P's jobs expect (its
runtime, on PATH or from P's modules; its image; GPUs per node; fabric), where plain `doctor` says
only what the node has (the old `--cluster example-ib` printed plain doctor's report, down to
"tasks run on the host's Python" for a profile that runs them in Apptainer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.doctor.fabric import ib_ports
from hpctrain.doctor.site_fit import fabric_fit, gpu_fit, profile_checks
from hpctrain.site.cluster_init import module_init
from hpctrain.site.profile import load_profile
from tests.doctor.fake_sysfs import run_cli


@pytest.fixture
def bare_path(tmp_path, monkeypatch) -> Path:
    """A PATH with no container runtime on it (only the system's tools and an empty bin)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.delenv("MODULEPATH", raising=False)
    return bindir


def profile_section(capsys, sysfs: Path, *args: str) -> tuple[dict[str, dict], dict]:
    """`doctor --json` here: its profile section's checks by name, and the whole report."""
    out = run_cli(capsys, "doctor", "--json", "--sysfs-root", str(sysfs), *args)[1]
    report = json.loads(out)
    return {c["name"]: c for c in report["checks"] if c["section"] == "profile"}, report


def test_a_login_node_checked_against_an_apptainer_profile_says_what_its_jobs_need(tmp_path, bare_path, capsys):
    """This machine has no GPU, no InfiniBand, no apptainer and not the profile's image: each is named
    against the profile's own value, and nothing claims tasks run on the host's Python."""
    checks, report = profile_section(capsys, tmp_path, "--cluster", "example-ib")
    assert report["profile"] == "example-ib"
    assert list(checks) == ["runtime", "image", "gpus", "fabric"]
    rt = checks["runtime"]
    assert rt["status"] == "info" and "starts each task with apptainer" in rt["value"]
    assert "container_modules (apptainer)" in rt["value"] and "module avail apptainer" in rt["hint"]
    image = checks["image"]
    assert image["status"] == "warn" and "/shared/images/hpctrain-pytorch-23.12.sif" in image["value"]
    assert checks["gpus"]["status"] == "info" and "ask for 8 per node" in checks["gpus"]["value"]
    assert checks["fabric"]["status"] == "info" and "fabric.kind ib" in checks["fabric"]["value"]
    text = run_cli(capsys, "doctor", "--sysfs-root", str(tmp_path), "--cluster", "example-ib")[1]
    head = text.splitlines()[0]
    assert head.startswith("hpctrain doctor — ") and head.endswith(", against cluster profile example-ib")
    assert "host's Python" not in text
    plain = run_cli(capsys, "doctor", "--sysfs-root", str(tmp_path))[1]
    assert "[profile]" not in plain and "host's Python" in plain and plain != text


def test_the_profiles_runtime_from_its_module_and_its_image_pass(tmp_path, bare_path, capsys, monkeypatch):
    """An Lmod tree whose apptainer/1.3.4 module puts an `apptainer` (answering --version as the real
    one does) on PATH: the runtime the profile's container_modules load counts; the image exists."""
    assert module_init(), "Lmod's init script (Debian's lmod package) is missing"
    mods, tool = tmp_path / "modulefiles", tmp_path / "apptainer-1.3.4" / "bin"
    (mods / "apptainer").mkdir(parents=True)
    tool.mkdir(parents=True)
    (tool / "apptainer").write_text("#!/bin/sh\necho 'apptainer version 1.3.4'\n")
    (tool / "apptainer").chmod(0o755)
    (mods / "apptainer" / "1.3.4.lua").write_text(f'prepend_path("PATH", "{tool}")\n')
    monkeypatch.setenv("MODULEPATH", str(mods))
    image = tmp_path / "train.sif"
    image.write_bytes(b"\0" * 4096)
    sets = ["--cluster-set", "container_modules=[apptainer/1.3.4]", "--cluster-set", f"container.image={image}"]
    checks, _ = profile_section(capsys, tmp_path, "--cluster", "example-ib", *sets)
    assert checks["runtime"]["status"] == "ok", checks["runtime"]
    assert "apptainer version 1.3.4 (module apptainer/1.3.4)" in checks["runtime"]["value"]
    assert checks["image"]["status"] == "ok" and str(image) in checks["image"]["value"]
    # without the module in the profile the same node lacks it
    checks, _ = profile_section(capsys, tmp_path, "--cluster", "example-ib", "--cluster-set", "container_modules=[]")
    assert checks["runtime"]["status"] == "info" and "container_modules (none)" in checks["runtime"]["value"]


def test_a_host_python_profile_whose_module_this_node_lacks_fails(tmp_path, bare_path, capsys, monkeypatch):
    """container.runtime none: the batch script loads the profile's modules; one `module -t avail` does
    not list fails the check (the job's `module load` would), one it lists passes."""
    assert module_init(), "Lmod's init script (Debian's lmod package) is missing"
    mods = tmp_path / "modulefiles"
    (mods / "cuda").mkdir(parents=True)
    (mods / "cuda" / "12.4.lua").write_text('setenv("CUDA_HOME", "/opt/cuda")\n')
    monkeypatch.setenv("MODULEPATH", str(mods))
    host = ["--cluster-set", "container.runtime=none"]
    checks, report = profile_section(capsys, tmp_path, "--cluster", "example-ib", *host)
    m = checks["modules"]
    assert m["status"] == "fail" and m["value"].endswith("not available here: nccl/2.21")
    assert "image" not in checks and not report["ok"]
    host += ["--cluster-set", "modules=[cuda]"]
    checks, report = profile_section(capsys, tmp_path, "--cluster", "example-ib", *host)
    assert checks["modules"]["status"] == "ok" and "modules cuda available" in checks["modules"]["value"]


def test_gpus_per_node_against_the_gpus_here():
    """A compute node with fewer GPUs than the profile asks for names the value that fits it."""
    prof = load_profile("example-ib", [])
    four = gpu_fit(prof, ["NVIDIA H100 80GB HBM3"] * 4)
    assert four.status == "warn" and "slurm.gpus_per_node: 4" in four.hint
    assert gpu_fit(prof, ["NVIDIA H100 80GB HBM3"] * 8).status == "ok"
    assert gpu_fit(load_profile("local", []), []).status == "ok"  # a CPU profile asks for none


def test_fabric_kind_ib_and_roce_on_a_dgx_h100(dgx_h100):
    """ib on a DGX H100 (12 ACTIVE InfiniBand ports) passes; roce there finds no Ethernet port."""
    ib = fabric_fit(load_profile("example-ib", []), ib_ports(dgx_h100), compute=True)
    assert ib.status == "ok" and "mlx5_0:1" in ib.value
    roce = fabric_fit(load_profile("example-ib", ["fabric.kind=roce"]), ib_ports(dgx_h100), compute=True)
    assert roce.status == "warn" and "no ACTIVE Ethernet port" in roce.value
    # inside an image no runtime is asked for: the image's own tools are not the nodes'
    inside = profile_checks(load_profile("example-ib", []), [], ib_ports(dgx_h100), inside=True)
    assert [c.name for c in inside] == ["image", "gpus", "fabric"]


def test_fabric_kind_socket_beside_an_active_hca(ib_node):
    """socket beside an ACTIVE HCA leaves it unused (the profile exports NCCL_IB_DISABLE=1)."""
    sock = fabric_fit(load_profile("local", []), ib_ports(ib_node), compute=True)
    assert sock.status == "warn" and "mlx5_0:1" in sock.value and "NCCL_IB_DISABLE=1" in sock.hint
