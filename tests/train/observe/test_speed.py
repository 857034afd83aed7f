"""Speed and memory in the train records: what a CPU run writes, the pure figures, NVML's absence."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import pytest
import torch

from hpctrain import flops
from hpctrain.config import load
from hpctrain.data.synthetic import SyntheticLoader
from hpctrain.models.vit import build_vit
from hpctrain.run.metrics import read_metrics
from hpctrain.train.dist import DistInfo
from hpctrain.train.loop import build_trainer
from hpctrain.train.observe import gpustats
from hpctrain.train.observe.speed import progress_text, speed_fields
from tests.helpers import DIGITS

CUDA_ONLY = {"mem_alloc_gb", "mem_reserved_gb", "mem_pct", "gpus"}


def train_records(tmp_path, *sets: str) -> list[dict]:
    cfg = load(
        DIGITS,
        [
            "data.loader=synthetic",
            "data.global_batch=16",
            "train.max_steps=4",
            "log.every=2",
            "train.eval_every_epochs=0",
            "ckpt.every=0",
            *sets,
        ],
    )
    loader = SyntheticLoader(
        train=True,
        batch_size=16,
        world=1,
        rank=0,
        size=64,
        img_size=cfg.model.img_size,
        num_classes=cfg.model.num_classes,
        seed=0,
        device=torch.device("cpu"),
    )
    torch.manual_seed(0)
    tmp_path.mkdir()
    build_trainer(cfg, DistInfo(), torch.device("cpu"), tmp_path, loader, None, build_vit(cfg.model)).run()
    return [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "train"]


def test_cpu_records_have_speed_and_rss_but_no_device_fields(tmp_path, capsys):
    recs = train_records(tmp_path / "a")
    assert [r["step"] for r in recs] == [2, 4]
    train_flops = flops.model_flops(load(DIGITS).model).train_flops
    for r in recs:
        assert r["step_time_s"] == pytest.approx(16 / r["images_per_s"])  # batch 16, one device
        assert r["tflops"] == pytest.approx(r["images_per_s"] * train_flops / 1e12)
        assert 0.01 < r["host_rss_gb"] < 64
        assert not CUDA_ONLY & set(r) and "mfu" not in r and "peak_tflops" not in r  # unknown CPU peak
    out = capsys.readouterr().out
    assert " rss " in out and "mfu" not in out
    # a peak given by the user: MFU against it, and the progress line shows it
    recs = train_records(tmp_path / "b", "log.peak_tflops=0.5")
    assert all(r["peak_tflops"] == 0.5 and r["mfu"] == pytest.approx(r["tflops"] / 0.5) for r in recs)
    assert " mfu " in capsys.readouterr().out


def test_speed_fields_and_progress_text():
    rec = speed_fields(images_per_s=4100.0, step_time_s=0.25, world=8, train_flops=105.4e9, peak_tflops=989.0)
    assert rec["tflops"] == pytest.approx(4100 * 105.4e9 / 8 / 1e12)
    assert rec["mfu"] == pytest.approx(rec["tflops"] / 989.0) and rec["peak_tflops"] == 989.0
    assert set(speed_fields(100.0, 0.1, 1, 1e9, None)) == {"step_time_s", "tflops"}
    line = progress_text({**rec, "mem_reserved_gb": 61.24, "mem_pct": 43.4, "host_rss_gb": 3.06})
    assert line == f" mfu {100 * rec['mfu']:.1f}% mem 61.2G 43% rss 3.1G"
    assert progress_text({"host_rss_gb": 0.4}) == " rss 0.4G" and progress_text({}) == ""


def test_h200_mfu_is_against_the_spec_peak_with_achievable_beside_it():
    vit_b = flops.model_flops(load(data={"model": {"arch": "vit_base"}}).model).train_flops
    spec, source = flops.peak_tflops("NVIDIA H200")
    assert spec == 989.0 and "dense" in source and flops.achievable_tflops("NVIDIA H200") == 790.0
    # the target of 4,100 images/s: 43.7 % MFU, 55 % of what a large matmul reaches there
    assert flops.mfu(4100, vit_b, spec) == pytest.approx(0.437, abs=0.001)
    assert flops.mfu(4100, vit_b, flops.achievable_tflops("NVIDIA H200")) == pytest.approx(0.547, abs=0.001)
    assert flops.achievable_tflops("NVIDIA A100-SXM4-80GB") is None


def test_memory_readers_off_cuda():
    assert gpustats.cuda_memory(torch.device("cpu")) == {}
    with open("/proc/self/status") as f:
        vmrss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    assert gpustats.host_rss_gb() == pytest.approx(vmrss_kb / 2**20, rel=0.05)


def nvml_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "hpctrain-nvml"]


def test_no_nvml_no_sampler_no_thread(monkeypatch):
    assert gpustats.NvmlSampler.start() is None  # this machine: pynvml installed, no NVML library
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the package not installed: ImportError
    assert gpustats.NvmlSampler.start() is None
    assert nvml_threads() == []


class FakeNvml:
    """Stands in for the driver, which this machine has not: fixed readings per call."""

    NVML_CLOCK_SM = 1

    def __init__(self, readings):
        self.readings = iter(readings)
        self.now = None

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802 - NVML's names
        self.now = next(self.readings)
        return SimpleNamespace(gpu=self.now[0])

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(used=self.now[1] * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        return self.now[2] * 1000  # milliwatts

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        assert kind == self.NVML_CLOCK_SM
        return self.now[3]


def test_sampler_window_means_and_memory_peak():
    s = gpustats.NvmlSampler(FakeNvml([(90, 40, 600, 1980), (70, 60, 400, 1755)]), ["gpu0"], interval_s=1)
    assert s.take() is None  # nothing read yet
    s.sample()
    s.sample()
    want = [{"index": 0, "util_pct": 80.0, "mem_used_gb": 60.0, "power_w": 500.0, "sm_clock_mhz": 1867.5}]
    assert s.take() == want
    assert s.take() == want  # no reading since: the last window's, not zeros


class NoPermission(Exception):
    """NVML's NVMLError_NoPermission, as str() gives it."""

    def __str__(self):
        return "Insufficient Permissions"


class NodeNvml(FakeNvml):
    """Stands in for a node's NVML: it counts `count` GPUs and refuses the handles of `refused`
    (a Slurm device cgroup), as nvmlDeviceGetCount_v2 / nvmlDeviceGetHandleByIndex_v2 do."""

    def __init__(self, count: int, refused: set[int]):
        super().__init__(iter(lambda: (50, 10, 300, 1500), None))  # the same reading forever
        self.count, self.refused, self.shut = count, refused, False

    def nvmlInit(self):  # noqa: N802 - NVML's names
        pass

    def nvmlDeviceGetCount(self):  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        if i in self.refused:
            raise NoPermission()
        return f"gpu{i}"

    def nvmlShutdown(self):  # noqa: N802
        self.shut = True


def test_gpu_nvml_cannot_open_is_skipped_alone_and_named_once(monkeypatch, hpctrain_log):
    monkeypatch.setitem(sys.modules, "pynvml", NodeNvml(4, refused={1, 3}))
    with hpctrain_log.at_level("DEBUG", logger="hpctrain"):
        s = gpustats.NvmlSampler.start(interval_s=0.01)
    assert s is not None
    try:
        s.sample()
        assert [g["index"] for g in s.take()] == [0, 2]  # NVML's own indices of the GPUs it opened
    finally:
        s.stop()
    said = [r for r in hpctrain_log.records if "skipped" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "INFO"
    assert "GPU 1 (Insufficient Permissions), 3 (Insufficient Permissions) skipped" in said[0].getMessage()


def test_gpu_nvml_opens_none_gives_no_sampler(monkeypatch, hpctrain_log):
    nvml = NodeNvml(2, refused={0, 1})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with hpctrain_log.at_level("INFO", logger="hpctrain"):
        assert gpustats.NvmlSampler.start() is None
    assert nvml.shut and nvml_threads() == []
    assert any(
        "GPU 0 (Insufficient Permissions), 1 (Insufficient Permissions) skipped" in r.getMessage()
        for r in hpctrain_log.records
    )


class FlakyNvml(FakeNvml):
    """GPU "bad" stops answering (every getter fails); the others read as FakeNvml does."""

    def __getattribute__(self, name):
        got = super().__getattribute__(name)
        if not name.startswith("nvmlDeviceGet"):
            return got

        def call(h, *a):
            if h == "bad":
                raise NoPermission()
            return got(h, *a)

        return call


def test_gpu_reading_that_fails_drops_only_that_gpu_said_once(hpctrain_log):
    s = gpustats.NvmlSampler(FlakyNvml([(90, 40, 600, 1980)] * 2), ["gpu0", "bad"], interval_s=1, indices=[4, 6])
    with hpctrain_log.at_level("INFO", logger="hpctrain"):
        s.sample()
        s.sample()
    assert s.take() == [{"index": 4, "util_pct": 90.0, "mem_used_gb": 40.0, "power_w": 600.0, "sm_clock_mhz": 1980.0}]
    said = [r for r in hpctrain_log.records if "GPU 6 failed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"


class NotSupported(Exception):
    """pynvml's NVMLError_NotSupported, as str() gives it."""

    def __str__(self):
        return "Not Supported"


class NoPowerNvml(NodeNvml):
    """A node's NVML whose GPUs do not report power (NVMLError_NotSupported, as on some boards)."""

    NVMLError_NotSupported = NotSupported

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        raise NotSupported()


def test_an_unsupported_nvml_field_leaves_the_gpus_other_fields_said_once(monkeypatch, hpctrain_log):
    monkeypatch.setitem(sys.modules, "pynvml", NoPowerNvml(2, refused=set()))
    with hpctrain_log.at_level("INFO", logger="hpctrain"):
        s = gpustats.NvmlSampler.start(interval_s=60)
        assert s is not None
        try:
            s.sample()
            s.sample()
            got = s.take()
        finally:
            s.stop()
    row = {"util_pct": 50.0, "mem_used_gb": 10.0, "sm_clock_mhz": 1500.0}  # power_w absent, not zero
    assert got == [{"index": 0, **row}, {"index": 1, **row}]
    said = [r for r in hpctrain_log.records if "power_w" in r.getMessage()]
    assert len(said) == 2 and {r.levelname for r in said} == {"INFO"}  # once per GPU, not per reading
    assert "GPU 0 does not report power_w (Not Supported)" in said[0].getMessage()
