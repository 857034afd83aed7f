"""The login node has no torch, numpy, DALI, PIL or matplotlib (sites forbid heavy work there, and
the package installs without them): every module the login node runs must import without them.
docs/architecture.md says which modules those are."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("numpy", "torch", "nvidia.dali", "PIL", "matplotlib")
# Packages and modules the login node runs (the CLI and the library under it), walked so that a
# new module is checked the day it is added.
LOGIN_PACKAGES = (
    "hpctrain.config",
    "hpctrain.cli",
    "hpctrain.launch",
    "hpctrain.plan",
    "hpctrain.images",
    "hpctrain.doctor",
    "hpctrain.watch",
)
LOGIN_MODULES = (
    "hpctrain.models.arch",
    "hpctrain.randaug_spec",
    "hpctrain.data.wds",
    "hpctrain.data.prep.pack",
    "hpctrain.data.folder",
)
TASK_ONLY_TOP = ("hpctrain.__main__",)  # runs the CLI on import

PROBE = r"""
import importlib, json, pkgutil, sys
import hpctrain
heavy, packages, modules, skip = json.loads(sys.argv[1])
names = [m.name for m in pkgutil.iter_modules(hpctrain.__path__, "hpctrain.") if not m.ispkg]
for p in packages:
    pkg = importlib.import_module(p)
    names += [p] + [m.name for m in pkgutil.walk_packages(pkg.__path__, p + ".")]
names = sorted(set(names + modules) - set(skip))
found = {}
for name in names:
    importlib.import_module(name)
    for h in heavy:
        if h in sys.modules and h not in found:
            found[h] = name  # the first login-node module that pulled it in
print(json.dumps({"checked": names, "heavy": found}))
"""


def test_every_login_node_module_imports_without_numpy_torch_dali_pil_matplotlib():
    args = json.dumps([HEAVY, LOGIN_PACKAGES, LOGIN_MODULES, TASK_ONLY_TOP])
    r = subprocess.run([sys.executable, "-c", PROBE, args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["checked"]) > 60 and "hpctrain.cli.submit" in out["checked"] and "hpctrain.config" in out["checked"]
    assert out["heavy"] == {}, f"imported on the login node: {out['heavy']} (heavy package: first module to import it)"
