"""What every task pays at start-up: torch.distributed.checkpoint (1.3-2.4 s to import here) only where a
sharded checkpoint or FSDP needs it, not in the modules every task imports with the loop."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import ROOT


def test_the_task_imports_no_distributed_checkpoint_before_it_needs_one():
    code = (
        "import sys; import hpctrain.launch.task, hpctrain.train.entry, hpctrain.train.loop; "
        "print(sorted(m for m in sys.modules if m.startswith('torch.distributed.checkpoint')))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
