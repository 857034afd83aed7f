"""The control group: CPU-tensor agreement never goes on a default group that serves only `cuda`.

`hpctrain train` with dist.parallel=fsdp on one GPU has an NCCL group of one (FSDP2's mesh needs a
default group); NCCL registers for the `cuda` device type only (torch/distributed/distributed_c10d.py,
`Backend.default_device_backend_map`: "nccl" for "cuda"), so a CPU tensor all-reduced on it fails
with "No backend type associated with device type cpu". Here a backend registered for `cuda` alone
(gloo underneath) stands in for NCCL on the CPU (issue 58).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as td

from hpctrain.train import collective, compat
from hpctrain.train.entry import run as train
from tests.helpers import DIGITS, run_metrics

CUDA_ONLY = "cudaonly"


def _gloo(store, rank, size, timeout):
    return td.ProcessGroupGloo(store, rank, size, timeout)


def register_cuda_only() -> None:
    """A process-group backend that, like NCCL, serves the `cuda` device type and no other."""
    if CUDA_ONLY not in td.Backend.backend_list:
        td.Backend.register_backend(CUDA_ONLY, _gloo, devices=["cuda"])


@pytest.fixture
def cuda_only_default_group(monkeypatch):
    """`collective.init` makes the default group with the cuda-only stand-in instead of the
    backend `entry.run` names (gloo on the CPU): the group of one of `hpctrain train` on one GPU."""
    register_cuda_only()
    real = collective.init

    def init(info, backend, timeout_s, group_of_one=False):
        return real(info, CUDA_ONLY, timeout_s, group_of_one)

    monkeypatch.setattr(collective, "init", init)
    yield
    collective.shutdown()


def test_the_stand_in_default_group_cannot_all_reduce_cpu_tensors():
    register_cuda_only()
    td.init_process_group(CUDA_ONLY, store=td.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            td.all_reduce(torch.zeros(1))
        assert collective.control_group(60) is not None  # and the control group is gloo's
    finally:
        collective.shutdown()


@pytest.mark.skipif(
    compat.version_tuple() < compat.FSDP_CPU_MIN_TORCH,
    reason=f"FSDP2 on the CPU needs torch >= 2.6; this is {torch.__version__}",
)
def test_fsdp_group_of_one_that_cannot_all_reduce_cpu_tensors_trains(digits_root, tmp_path, cuda_only_default_group):
    """Through `entry.run`, as `hpctrain train` runs it: the run lock's and the requeue budget's
    agreement, the stop rounds, the checkpoint's RNG gather and its settling all go on the gloo
    control group (before: the first `agree` failed on the default group)."""
    out = train(
        {
            **_digits(digits_root, tmp_path),
            "dist": {"parallel": "fsdp"},
        }
    )
    assert out["status"] == "finished" and out["world_size"] == 1
    assert len(run_metrics(tmp_path / "one", "train")) == 2
    assert run_metrics(tmp_path / "one", "checkpoint")
    assert not td.is_initialized()


def _digits(root, run_dir) -> dict:
    from hpctrain.config import load, to_dict

    cfg = to_dict(
        load(
            DIGITS,
            [
                f"data.root={root}",
                f"run.dir={run_dir}",
                "run.name=one",
                "train.device=cpu",
                "train.threads=1",
                "train.max_steps=2",
                "log.every=1",
                "train.eval_every_epochs=0",
                "log.trackers=[]",
                "model.depth=1",
            ],
        )
    )
    return cfg
