"""compile.warmup: a compiled DDP run compiles before its first collective, so a rank whose
first compile outlasts dist.pg_timeout_s does not time the others out, and the weights it trains
are bit-for-bit those of a run without the warm-up (the code before it)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import DIGITS, run_ranks

WORKER = ["-m", "tests.train.compile_worker"]
SETS = [
    "train.max_steps=3",
    "compile.enabled=true",
    "model.depth=1",
    "train.threads=1",
    "log.every=1",
    "train.eval_every_epochs=0",
    "ckpt.every=0",
    "health.hang_timeout_s=0",
    "log.trackers=[]",
]
# Rank 1's first compile sleeps past the collective timeout, by a margin that the other differences
# between the ranks (start-up, compile times: seconds apart on a loaded machine) cannot close: with
# 8 s and 12 s, the run without the warm-up once ended without a timeout under `stress-ng --cpu 2`
# (4 s of margin were less than those differences there). The timeout itself stays above them.
PG_TIMEOUT_S, SLOW_S = 10, 30


def run(digits_root, tmp_path, name: str, *sets: str, slow: bool = False, check: bool = True):
    out = tmp_path / name
    out.mkdir()
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # shared: only the first run compiles cold
    if slow:
        env |= {"SLOW_COMPILE_RANK": "1", "SLOW_COMPILE_S": str(SLOW_S)}
    results = run_ranks(
        2,
        [*WORKER, str(DIGITS), str(out), f"data.root={digits_root}", f"run.dir={out}", *SETS, *sets],
        timeout=400,
        env=env,
        check=check,
    )
    return out, results


@pytest.mark.slow  # three compiled 2-rank runs (the first cold): ~1-2 min on 2 cores
def test_slow_compile_on_one_rank_does_not_time_out_the_others(digits_root, tmp_path):
    warm, results = run(digits_root, tmp_path, "warm", f"dist.pg_timeout_s={PG_TIMEOUT_S}", slow=True)
    assert "torch.compile warm-up" in results[0].stdout
    assert not any("did not rebuild its gradient buckets" in r.stdout for r in results)  # settling as before
    # the same slow rank without the warm-up (the code before it): rank 0 times out in DDP's first backward
    _, results = run(
        digits_root,
        tmp_path,
        "unwarmed",
        f"dist.pg_timeout_s={PG_TIMEOUT_S}",
        "compile.warmup=false",
        slow=True,
        check=False,
    )
    assert results[0].returncode != 0 and "timed out" in results[0].stdout.lower(), results[0].stdout[-3000:]
    # the warm-up changes no number: bit-exact against a run without it (OMP_NUM_THREADS=1, threads=1)
    ref, _ = run(digits_root, tmp_path, "ref", "compile.warmup=false")
    for r in range(2):
        a = torch.load(warm / f"rank-{r}.pt", weights_only=True)
        b = torch.load(ref / f"rank-{r}.pt", weights_only=True)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"rank {r}: {k} differs with the warm-up"


@pytest.mark.slow  # three compiled 2-rank FSDP runs: ~1-2 min on 2 cores
def test_under_fsdp_a_slow_first_compile_runs_under_the_compile_timeout(digits_root, tmp_path):
    """FSDP's forward all-gathers, so its first compile runs inside collectives: the warm-up raises
    the group's timeout to compile.timeout_s for one throwaway forward + backward. Before, nothing
    warmed FSDP up: the slow rank's compile held rank 0 in the first step's collectives past
    dist.pg_timeout_s (the run with compile.warmup=false below), and the job failed."""
    fsdp = ["dist.parallel=fsdp", f"dist.pg_timeout_s={PG_TIMEOUT_S}"]
    warm, results = run(digits_root, tmp_path, "warm", *fsdp, slow=True)
    assert "torch.compile warm-up (FSDP" in results[0].stdout
    _, results = run(digits_root, tmp_path, "unwarmed", *fsdp, "compile.warmup=false", slow=True, check=False)
    assert results[0].returncode != 0 and "timed out" in results[0].stdout.lower(), results[0].stdout[-3000:]
    ref, _ = run(digits_root, tmp_path, "ref", "dist.parallel=fsdp", "compile.warmup=false")
    for r in range(2):  # each rank's shards, bit for bit
        a = torch.load(warm / f"rank-{r}.pt", weights_only=True)
        b = torch.load(ref / f"rank-{r}.pt", weights_only=True)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"rank {r} differs"
