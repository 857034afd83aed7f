"""Versions of everything that must fit together (Python, torch, CUDA, cuDNN, NCCL, driver, DALI)
and the GPUs torch can use. torch is imported only if installed: on a login node it is not."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path

from hpctrain import __version__
from hpctrain.doctor.checks import Check
from hpctrain.version import dist_versions

# Minimum driver for a CUDA major version (CUDA minor-version compatibility).
MIN_DRIVER = {12: (525, 60), 11: (450, 80)}


def driver_version(proc_root: str = "/proc") -> str | None:
    try:
        text = Path(proc_root, "driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", text) or re.search(
        r"\s(\d{3}\.\d+(?:\.\d+)?)\s", text
    )
    return m.group(1) if m else None


def versions() -> dict[str, str | None]:
    """Versions of everything that must fit together; None where absent. Imports torch if present."""
    v: dict[str, str | None] = {
        "python": platform.python_version(),
        "hpctrain": __version__,
        "torch": None,
        "cuda": None,
        "cudnn": None,
        "nccl": None,
        "torch_cuda_available": None,
        "dali": None,
        "dali_package": None,
        "driver": driver_version(),
    }
    try:  # torch only where installed: a login node has none, and the import costs seconds
        import torch  # torch: doctor runs on the login node too, where torch may be missing
    except ImportError:
        pass
    except Exception as e:  # a broken install (missing CUDA libraries, …) is itself a finding
        v["torch"] = f"broken: {type(e).__name__}: {e}"
    else:
        v["torch"] = torch.__version__
        v["cuda"] = torch.version.cuda
        cudnn = torch.backends.cudnn.version() if torch.version.cuda else None
        v["cudnn"] = (
            f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}"
            if cudnn and cudnn >= 10000
            else (f"{cudnn // 1000}.{cudnn // 100 % 10}.{cudnn % 100}" if cudnn else None)
        )
        try:
            nccl = torch.cuda.nccl.version()
            v["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:  # CPU builds have no NCCL
            v["nccl"] = None
        try:
            v["torch_cuda_available"] = bool(torch.cuda.is_available())
        except Exception:
            v["torch_cuda_available"] = False
    dali = dist_versions("nvidia-dali")
    if dali:
        v["dali_package"] = ", ".join(sorted(dali))
        v["dali"] = ", ".join(dali[k] for k in sorted(dali))
    return v


def gpus() -> list[str]:
    """Names of the GPUs torch can use, else those `nvidia-smi -L` lists (present but maybe unusable)."""
    if "torch" in sys.modules or _importable("torch"):
        try:
            import torch  # installed (checked above); imported here only, see versions()

            if torch.cuda.is_available():
                return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:
            pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return [ln.split(":", 1)[1].split("(")[0].strip() for ln in out.splitlines() if ln.startswith("GPU")]
        except (OSError, subprocess.SubprocessError):
            return []
    return []


def _importable(name: str) -> bool:
    return find_spec(name) is not None


def version_checks(v: Mapping[str, str | None], gpu_names: list[str]) -> list[Check]:
    checks = []
    py = tuple(int(x) for x in (v["python"] or "0.0").split(".")[:2])
    checks.append(
        Check(
            "versions",
            "python",
            "ok" if py >= (3, 10) else "fail",
            v["python"] or "?",
            "" if py >= (3, 10) else "hpctrain needs Python ≥ 3.10",
        )
    )
    torch_v = v["torch"]
    if torch_v is None:
        checks.append(
            Check(
                "versions",
                "torch",
                "info",
                "not installed",
                "fine on a login node; training needs `pip install hpctrain[train]` or the image",
            )
        )
    elif torch_v.startswith("broken"):
        checks.append(Check("versions", "torch", "fail", torch_v, "reinstall torch or use the image"))
    else:
        build = f"CUDA {v['cuda']}" if v["cuda"] else "CPU build"
        status, hint = "ok", ""
        if gpu_names and not v["cuda"]:
            status, hint = (
                "fail",
                "GPUs are visible but torch is a CPU build: install a CUDA build or use the image",
            )
        elif gpu_names and v.get("torch_cuda_available") is False:
            status, hint = (
                "fail",
                (
                    f"GPUs are present but torch (CUDA {v['cuda']}) cannot use them: driver too old, "
                    "CUDA_VISIBLE_DEVICES, or a container started without --nv"
                ),
            )
        checks.append(Check("versions", "torch", status, f"{torch_v} ({build})", hint))
        if v["cuda"]:
            checks.append(Check("versions", "cudnn", "ok" if v["cudnn"] else "warn", v["cudnn"] or "none"))
            checks.append(
                Check(
                    "versions",
                    "nccl",
                    "ok" if v["nccl"] else "warn",
                    v["nccl"] or "none",
                    "" if v["nccl"] else "torch has no NCCL: multi-GPU training will use gloo",
                )
            )
    drv = v["driver"]
    if drv and v["cuda"]:
        major = int(v["cuda"].split(".")[0])
        need = MIN_DRIVER.get(major)
        have = tuple(int(x) for x in drv.split(".")[:2])
        ok = need is None or have >= need
        checks.append(
            Check(
                "versions",
                "driver",
                "ok" if ok else "fail",
                drv,
                ""
                if ok
                else f"CUDA {v['cuda']} needs driver ≥ {need[0]}.{need[1]}: use an image with an "
                "older CUDA or ask for a driver update",
            )
        )
    elif drv:
        checks.append(Check("versions", "driver", "ok", drv))
    if v["dali"] is None:
        checks.append(Check("versions", "dali", "info", "not installed", "the torch (PIL) loader works without it"))
    else:
        pkgs = (v["dali_package"] or "").split(", ")
        status, hint = "ok", ""
        if len(pkgs) > 1:
            status, hint = (
                "warn",
                "several DALI packages installed: keep one (in NGC images, the one NGC ships)",
            )
        else:
            m = re.search(r"cuda(\d+)", pkgs[0])
            if m and v["cuda"] and int(m.group(1)[:-1]) != int(v["cuda"].split(".")[0]):
                status, hint = (
                    "warn",
                    f"{pkgs[0]} is built for CUDA {m.group(1)[:-1]} but torch for CUDA {v['cuda']}",
                )
        checks.append(Check("versions", "dali", status, f"{v['dali']} ({v['dali_package']})", hint))
    if gpu_names:
        checks.append(Check("gpu", "gpus", "ok", f"{len(gpu_names)}: " + ", ".join(sorted(set(gpu_names)))))
    else:
        hint = (
            "CUDA_VISIBLE_DEVICES is empty"
            if os.environ.get("CUDA_VISIBLE_DEVICES") == ""
            else "fine on a login node; on a GPU node check the allocation (--gpus) and `--nv` for containers"
        )
        checks.append(Check("gpu", "gpus", "info", "none visible", hint))
    return checks
