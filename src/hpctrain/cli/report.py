"""`hpctrain report`: figures of one or more runs' metrics (PNG, or HTML with a summary table)."""

from __future__ import annotations

import argparse

from hpctrain.watch.report import expand_sweeps, load_run, write


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report", help="plot runs' loss, lr, accuracy, speed and memory to a PNG or HTML file", description=__doc__
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directory (runs/<name>), its metrics.jsonl, a "
        "run name under ./runs, or a sweep (all its runs); several are overlaid",
    )
    p.add_argument("-o", "--output", default="report.png", help="report.png or report.html (default report.png)")
    p.add_argument(
        "--x",
        choices=("step", "wall", "both"),
        default="both",
        help="x axis: optimizer step, wall time since the run's start, or both (default)",
    )
    p.add_argument(
        "--source",
        choices=("metrics", "mlflow"),
        default="metrics",
        help="read each run's metrics.jsonl (default) or its MLflow run (log.trackers: [mlflow]; "
        "needs pip install 'hpctrain[trackers]')",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    runs = [load_run(r, name, args.source) for r, name in expand_sweeps(args.runs)]
    out = write(runs, args.output, args.x)
    print(f"wrote {out} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    return 0
