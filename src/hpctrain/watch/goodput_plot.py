"""The goodput row of `hpctrain report`: a stacked bar per attempt (where each process's time went,
run/goodput.py's categories) and the run's productive time against its wall time.

Draws on axes it is given (watch/report.py builds the figure and imports matplotlib); a run with no
ledger (no startup record: an older run, or an MLflow source) is left out of both.
"""

from __future__ import annotations

from hpctrain.run.goodput import NAMES, Ledger

# one colour per category, the same in every report (tab20-like, fixed so the legend reads alike)
COLOURS = dict(
    zip(
        NAMES,
        (
            "#bbbbbb",  # queue
            "#ff7f0e",  # startup
            "#2ca02c",  # productive
            "#1f77b4",  # checkpoint
            "#9467bd",  # eval
            "#d62728",  # lost
            "#8c564b",  # restart
            "#e377c2",  # data_wait
            "#bcbd22",  # straggler
            "#7f7f7f",  # idle
        ),
        strict=True,
    )
)


def bar_rows(name: str, ledger: Ledger) -> list[tuple[str, dict[str, float]]]:
    """(label, seconds per category) per attempt, then the whole run (queue waits and gaps included)."""
    rows = []
    for a in ledger.attempts:
        job = f"job {a['job']}.{a.get('slurm_restart') or 0} " if a.get("job") else ""
        label = f"{name} {job}attempt {a.get('attempt') or 0}"
        rows.append((label, dict(a["seconds"])))
    rows.append((f"{name} (whole run)", {c: ledger.total(c) for c in NAMES}))
    return rows


def draw(ax_bars, ax_line, ledgers: list[tuple[str, Ledger]], colours: list[str], unit: tuple[str, float]) -> None:
    """Stacked horizontal bars per attempt on `ax_bars`; cumulative productive vs wall on `ax_line`."""
    unit_name, scale = unit
    rows = [row for name, led in ledgers for row in bar_rows(name, led)]
    labelled: set[str] = set()  # each category in the legend once, in the order it first appears
    for y, (_, secs) in enumerate(rows):
        left = 0.0
        for c in NAMES:
            v = secs.get(c, 0.0) / scale
            if v > 0:
                ax_bars.barh(y, v, left=left, color=COLOURS[c], height=0.7, label=None if c in labelled else c)
                labelled.add(c)
                left += v
    ax_bars.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax_bars.invert_yaxis()
    ax_bars.set_xlabel(f"time ({unit_name})", fontsize=8)
    ax_bars.set_title("goodput: where each attempt's time went", fontsize=9)
    ax_bars.legend(fontsize=7, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    for i, (name, led) in enumerate(ledgers):
        xs = [0.0] + [(t - led.begin) / scale for t, _ in led.timeline]
        ys = [0.0] + [p / scale for _, p in led.timeline]
        ax_line.plot(xs, ys, color=colours[i], lw=1.2, label=f"{name} productive")
    top = max((led.wall_s / scale for _, led in ledgers), default=1.0)
    ax_line.plot([0, top], [0, top], color="0.5", ls=":", lw=1.0, label="wall time (100 % goodput)")
    ax_line.set_xlabel(f"wall time since the first submission ({unit_name})", fontsize=8)
    ax_line.set_ylabel(f"productive training ({unit_name})", fontsize=8)
    ax_line.set_title("productive time vs wall time", fontsize=9)
    ax_line.legend(fontsize=7, frameon=False)
    ax_line.grid(alpha=0.3)
