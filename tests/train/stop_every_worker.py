"""Test worker: a rank of `hpctrain train` on the digits config, in-process, with the stop agreement
every K steps (dist.stop_every) and one stop of a kind (tests/train/test_stop_every.py):

- time_limit / preemption / interrupt: rank SIGNALS[kind][0] sends itself that signal (the real
  handler) when it begins the step after SIGNALS[kind][1];
- nonfinite: HPCTRAIN_TEST_NAN (set by the test) makes one rank's loss NaN; health.on_nonfinite=stop;
- rollback: the same NaN rolled back to the last checkpoint (step CKPT_EVERY), then rank 0 sends
  itself SIGUSR2 when it begins the step after ROLLBACK_SIGNAL (which only the replay reaches).

Writes result-<rank>.json: the outcome (or the error) and the steps this rank began.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from hpctrain.config import load
from hpctrain.train import collective, stop
from hpctrain.train.health.rollback import RunDiverged
from tests.helpers import DIGITS
from tests.train.worker import cpu_trainer, join

# kind → (the rank that is signalled, the step it has finished when it is, the signal)
SIGNALS = {
    "time_limit": (3, 4, signal.SIGUSR2),
    "preemption": (2, 6, signal.SIGTERM),
    "interrupt": (1, 2, signal.SIGINT),
}
NAN = "2:5"  # HPCTRAIN_TEST_NAN: rank 2's loss at step 5
CKPT_EVERY = 4
ROLLBACK_SIGNAL = 7
MAX_STEPS = 15


def agreed_stop(posted_from: int, every: int, sent_after: int) -> int:
    """The step every rank stops at: rounds are posted at posted_from, +every, ...; a signal that
    came while step sent_after+1 ran goes with the first round posted after that step, which the
    boundary `every` steps later reads."""
    b = posted_from
    while b < sent_after + 1:
        b += every
    return b + every


def main(root: str, out: str, kind: str, every: str) -> None:
    sets = [
        f"data.root={root}",
        f"run.dir={out}",
        "run.name=run",
        "train.threads=1",
        "log.every=1",
        "train.eval_every_epochs=0",
        f"ckpt.every={CKPT_EVERY}",
        f"train.max_steps={MAX_STEPS}",
        f"dist.stop_every={every}",
        f"health.on_nonfinite={'stop' if kind == 'nonfinite' else 'rollback'}",
    ]
    cfg = load(DIGITS, sets)
    flag = stop.install(interrupt=True)
    info = join(cfg, 60)
    run_dir = Path(out) / "run"
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    began: list[int] = []
    trainer = cpu_trainer(cfg, info, run_dir if info.is_main else None, None, flag)
    step_fn = trainer.train_step
    who, at, sig = SIGNALS.get(kind, (0, ROLLBACK_SIGNAL if kind == "rollback" else -1, signal.SIGUSR2))

    def train_step(batches):
        began.append(trainer.step)
        if info.rank == who and trainer.step == at:
            os.kill(os.getpid(), sig)
        return step_fn(batches)

    trainer.train_step = train_step
    res = {"began": began, "every": trainer.stops.every}
    try:
        result = trainer.run()
        res.update(status=result.status, step=result.step, stop_kind=result.stop_kind)
    except RunDiverged as e:
        res.update(status="diverged", step=trainer.step, error=str(e))
    trainer.close()
    Path(out, f"result-{info.rank}.json").write_text(json.dumps(res))
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
