"""`hpctrain report`: one figure of several runs' metrics.jsonl (or MLflow runs), as PNG or a self-contained HTML page.

Login-node code: reads JSON lines only (no torch); matplotlib (the `report` extra) is imported
when a figure is drawn, with the Agg backend, so it runs without a display. Panels (loss, lr,
val top-1/top-5 and EMA, images/s, MFU, data wait, memory, step time) are drawn against the
step, the wall time since the run's first record, or both (one block of rows each). A panel
whose fields no run has says "no data" rather than vanishing, so every report has the same
layout. Stops, requeues and restarts (a wall-clock gap with no stop record: a crash or a node
failure) are vertical lines in the run's colour.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.config import load
from hpctrain.errors import UserError
from hpctrain.run.goodput import Ledger, run_records
from hpctrain.run.layout import CONFIG, METRICS, RUNS
from hpctrain.run.metrics import read_metrics
from hpctrain.watch import goodput_plot
from hpctrain.watch.ledger import run_ledger


class ReportError(UserError):
    """A report that cannot be drawn; the CLI prints it as one line."""


@dataclass(frozen=True)
class Series:
    kind: str  # record kind: train or eval
    key: str  # field of the record
    label: str  # legend suffix when a panel has several series ("" for one)
    style: str = "-"
    scale: float = 1.0  # e.g. 100 for a 0-1 share drawn in %


@dataclass(frozen=True)
class Panel:
    title: str  # with the unit
    series: tuple[Series, ...]
    log_y: bool = False


PANELS = (
    Panel("train loss", (Series("train", "loss", ""),)),
    Panel("learning rate", (Series("train", "lr", ""),)),
    Panel(
        "val accuracy (%): top-1 —, top-5 ··, EMA top-1 --",
        (
            Series("eval", "top1", "top-1"),
            Series("eval", "top5", "top-5", ":"),
            Series("eval", "ema_top1", "EMA top-1", "--"),
        ),
    ),
    Panel("throughput (images/s)", (Series("train", "images_per_s", ""),)),
    Panel("MFU (% of peak)", (Series("train", "mfu", "", scale=100.0),)),
    Panel("data wait (% of time)", (Series("train", "data_wait", "", scale=100.0),)),
    Panel(
        "memory (GB): host RSS —, CUDA reserved --, allocated ··",
        (
            Series("train", "host_rss_gb", "host RSS"),
            Series("train", "mem_reserved_gb", "CUDA reserved", "--"),
            Series("train", "mem_alloc_gb", "CUDA allocated", ":"),
        ),
    ),
    Panel("step time (s)", (Series("train", "step_time_s", ""),)),
)
COLUMNS = 4
DPI = 100
X_AXES = ("step", "wall")
MARK_STYLE = {"stop": ":", "requeue": "--", "restart": "-."}


@dataclass
class Run:
    name: str
    records: list[dict]
    marks: list[tuple[str, int, float]] = field(default_factory=list)  # (kind, step, time)
    ledger: Ledger | None = None  # where its time went (run/goodput.py); None without startup records

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.records if r.get("kind") == kind]

    @property
    def t0(self) -> float:
        return min((r["time"] for r in self.records if _num(r.get("time"))), default=0.0)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def find_metrics(target: str | Path) -> Path:
    """A run directory, its metrics.jsonl, or a run name under ./runs."""
    p = Path(target)
    for cand in (p / METRICS, p, RUNS / p / METRICS):
        if cand.is_file():
            return cand
    raise ReportError(f"no metrics.jsonl for {target}: give a run directory (runs/<name>) or its metrics.jsonl")


def restart_marks(
    records: list[dict], gap_factor: float = 20.0, min_gap_s: float = 60.0
) -> list[tuple[str, int, float]]:
    """(kind, step, time) of each stop and requeue record, and of each wall-clock gap between
    consecutive train records longer than `gap_factor` × their median spacing (and `min_gap_s`)
    that no stop explains: a restart after a crash or a lost node."""
    marks = [
        (r["kind"], int(r.get("step") or 0), r["time"])
        for r in records
        if r.get("kind") in ("stop", "requeue") and _num(r.get("time"))
    ]
    trains = [r for r in records if r.get("kind") == "train" and _num(r.get("time"))]
    dts = [b["time"] - a["time"] for a, b in zip(trains, trains[1:])]
    if dts:
        limit = max(gap_factor * statistics.median(dts), min_gap_s)
        stops = [t for _, _, t in marks]
        for a, b, dt in zip(trains, trains[1:], dts):
            if dt > limit and not any(a["time"] <= t <= b["time"] for t in stops):
                marks.append(("restart", int(a["step"]), a["time"]))
    return sorted(marks, key=lambda m: m[2])


def expand_sweeps(targets: list[str]) -> list[tuple[str, str | None]]:
    """(target, name) per run: a sweep directory (`hpctrain sweep`: its sweep.json, also as
    runs/<name>) stands for its members that have metrics yet, named as in the sweep's table."""
    out: list[tuple[str, str | None]] = []
    for t in targets:
        sweep = next((d / "sweep.json" for d in (Path(t), RUNS / t) if (d / "sweep.json").is_file()), None)
        if sweep is None:
            out.append((t, None))
            continue
        members = json.loads(sweep.read_text()).get("members", [])
        runs = [(m["run_dir"], m.get("name")) for m in members if (Path(m["run_dir"]) / METRICS).is_file()]
        if not runs:
            raise ReportError(f"sweep {t} has no run with metrics yet: wait until its members start")
        out += runs
    return out


def load_run(target: str | Path, name: str | None = None, source: str = "metrics") -> Run:
    path = find_metrics(target)
    if source == "mlflow":
        records = mlflow_records(path.parent)
    else:
        records = [r for r in read_metrics(path) if isinstance(r, dict)]
    if not records:
        raise ReportError(f"{path} holds no records yet")
    run_name = name or (path.parent.name if path.name == METRICS else path.stem)
    ledger = run_ledger(run_records(path.parent, records)) if source == "metrics" and path.name == METRICS else None
    return Run(run_name, records, restart_marks(records), ledger if ledger and ledger.attempts else None)


SOURCES = ("metrics", "mlflow")  # where `hpctrain report --source` reads a run's records


def mlflow_records(run_dir: Path) -> list[dict]:
    """The train and eval records of a run rebuilt from its MLflow run (`log.trackers: [mlflow]`):
    one record per kind and step, a field per metric `<kind>/<field>`, the time from the metric's
    timestamp. The store is the run's `log.mlflow_uri` (config.yaml), else `<run>/mlruns`. Stops
    are not in MLflow: the wall axis marks only gaps (restart_marks)."""
    from hpctrain.train.observe.trackers import mlflow_sink, run_key  # heavy optional package: only for --source mlflow

    cfg_path = run_dir / CONFIG
    t = load(cfg_path).log if cfg_path.is_file() else None
    uri, experiment = (t.mlflow_uri, t.mlflow_experiment) if t else ("", "hpctrain")
    client = mlflow_sink.MlflowClient(tracking_uri=mlflow_sink.store_uri(uri, run_dir))
    run = mlflow_sink.find_run(client, experiment, run_key(run_dir))
    if run is None:
        raise ReportError(
            f"no MLflow run of {run_dir} in {client.tracking_uri}: was it trained with "
            "log.trackers listing mlflow? (or report with --source metrics)"
        )
    recs: dict[tuple[int, str], dict] = {}
    for key in run.data.metrics:
        kind, _, name = key.partition("/")
        if kind not in ("train", "eval"):
            continue  # per-GPU curves (gpu<i>/...) are not drawn
        for m in client.get_metric_history(run.info.run_id, key):
            rec = recs.setdefault((m.step, kind), {"kind": kind, "step": m.step, "time": m.timestamp / 1000})
            rec[name] = m.value
    return [recs[k] for k in sorted(recs, key=lambda k: (k[0], k[1] != "train"))]


def _wall_unit(runs: list[Run]) -> tuple[str, float]:
    span = max((max(r["time"] for r in run.records if _num(r.get("time"))) - run.t0 for run in runs), default=0)
    if span >= 2 * 3600:
        return "h", 3600.0
    return ("min", 60.0) if span >= 120 else ("s", 1.0)


def _points(run: Run, s: Series, x: str, unit: float) -> tuple[list[float], list[float]]:
    """The series against step or wall time; on the wall axis the line breaks (NaN) at each
    stop or restart, so a requeue's wait shows as a gap rather than a straight segment."""
    xs, ys, prev_t = [], [], None
    for r in run.of(s.kind):
        v = r.get(s.key)
        if _num(v) and _num(r.get("step")) and _num(r.get("time")):
            if x == "wall" and prev_t is not None and any(prev_t <= m[2] < r["time"] for m in run.marks):
                xs.append(math.nan)
                ys.append(math.nan)
            xs.append(r["step"] if x == "step" else (r["time"] - run.t0) / unit)
            ys.append(v * s.scale)
            prev_t = r["time"]
    return xs, ys


def _resumed_at(run: Run, t: float) -> float | None:
    """Wall time of the first train or eval record after `t` (None: the run did not go on)."""
    return min(
        (
            r["time"]
            for r in run.records
            if r.get("kind") in ("train", "eval") and _num(r.get("time")) and r["time"] > t
        ),
        default=None,
    )


def figure_inches(x: str, goodput: bool = False) -> tuple[float, float]:
    """Width and height: 4.2 × 3 inches per panel, one block of rows per x axis, and the goodput row."""
    rows = -(-len(PANELS) // COLUMNS) * (len(X_AXES) if x == "both" else 1) + (1 if goodput else 0)
    return 4.2 * COLUMNS, 3.0 * rows


def figure(runs: list[Run], x: str = "both"):
    """The matplotlib Figure: one block of panel rows per x axis (`step`, `wall` or `both`)."""
    if not runs:
        raise ReportError("no runs to report")
    if x not in (*X_AXES, "both"):
        raise ReportError(f"--x {x}: use step, wall or both")
    try:
        import matplotlib  # matplotlib: optional (the report extra), only for figures

        matplotlib.use("Agg")
        from matplotlib.figure import Figure  # matplotlib: optional (the report extra), only for figures
        from matplotlib.lines import Line2D
    except ImportError as e:
        raise ReportError(f"hpctrain report needs matplotlib ({e}): pip install 'hpctrain[report]'") from e

    axes_x = list(X_AXES) if x == "both" else [x]
    rows_per = -(-len(PANELS) // COLUMNS)
    ledgers = [(r.name, r.ledger) for r in runs if r.ledger]
    rows = rows_per * len(axes_x)
    fig = Figure(figsize=figure_inches(x, bool(ledgers)), dpi=DPI, layout="constrained")
    grid = fig.subplots(rows + (1 if ledgers else 0), COLUMNS, squeeze=False)  # the goodput row: goodput_plot
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = [colours[i % len(colours)] for i in range(len(runs))]  # by position: names may repeat
    unit_name, unit = _wall_unit(runs)
    used_marks: set[str] = set()
    for block, xa in enumerate(axes_x):
        xlabel = "step" if xa == "step" else f"wall time since start ({unit_name})"
        cells = [grid[block * rows_per + i // COLUMNS][i % COLUMNS] for i in range(rows_per * COLUMNS)]
        for ax, panel in zip(cells, PANELS):
            ax.set_title(panel.title, fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            drawn = False
            for i, run in enumerate(runs):
                for s in panel.series:
                    xs, ys = _points(run, s, xa, unit)
                    if xs:
                        ax.plot(
                            xs,
                            ys,
                            s.style,
                            color=colour[i],
                            lw=1.2,
                            marker="o" if len(xs) < 30 else None,
                            ms=2.5,
                            label=f"{run.name} {s.label}".strip(),
                        )
                        drawn = True
            if not drawn:
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            for i, run in enumerate(runs):
                for kind, step, t in run.marks:
                    ax.axvline(
                        step if xa == "step" else (t - run.t0) / unit,
                        color=colour[i],
                        ls=MARK_STYLE[kind],
                        lw=1.0,
                        alpha=0.8,
                    )
                    used_marks.add(kind)
                    back = _resumed_at(run, t) if xa == "wall" else None
                    if back is not None:  # the time between the stop and the next record
                        ax.axvspan((t - run.t0) / unit, (back - run.t0) / unit, color=colour[i], alpha=0.12, lw=0)
        for ax in cells[len(PANELS) :]:
            ax.set_axis_off()
    if ledgers:  # the last row: the bars over two columns, the productive-time line over the others
        gs = grid[0][0].get_gridspec()
        for ax in grid[rows]:
            ax.remove()
        bars, line = fig.add_subplot(gs[rows, :2]), fig.add_subplot(gs[rows, 2:])
        goodput_plot.draw(bars, line, ledgers, [colour[i] for i, r in enumerate(runs) if r.ledger], (unit_name, unit))
    handles = [Line2D([], [], color=colour[i], lw=2, label=r.name) for i, r in enumerate(runs)]
    handles += [Line2D([], [], color="0.3", ls=MARK_STYLE[k], label=k) for k in MARK_STYLE if k in used_marks]
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 6), fontsize=9, frameon=False)
    return fig


def summary(run: Run) -> list[tuple[str, str]]:
    """A few numbers per run for the HTML table."""
    trains, evals = run.of("train"), run.of("eval")
    last = run.records[-1]
    end = run.of("end")
    status = (
        end[-1].get("status", "?")
        if end
        else ("stopped" if last.get("kind") in ("stop", "requeue") else "running or cut")
    )

    def med(key: str, scale: float = 1.0) -> str:
        vals = [r[key] * scale for r in trains if _num(r.get(key))]
        return f"{statistics.median(vals):.3g}" if vals else "–"

    top1 = [r["top1"] for r in evals if _num(r.get("top1"))]
    steps = [r["step"] for r in run.records if _num(r.get("step"))]
    span = max(r["time"] for r in run.records if _num(r.get("time"))) - run.t0
    return [
        ("status", status),
        ("last step", str(max(steps, default=0))),
        ("final val top-1 (%)", f"{top1[-1]:.2f}" if top1 else "–"),
        ("best val top-1 (%)", f"{max(top1):.2f}" if top1 else "–"),
        ("final train loss", f"{trains[-1]['loss']:.4f}" if trains and _num(trains[-1].get("loss")) else "–"),
        ("median images/s", med("images_per_s")),
        ("median MFU (%)", med("mfu", 100.0)),
        ("median data wait (%)", med("data_wait", 100.0)),
        ("stops / requeues / restarts", " / ".join(str(sum(m[0] == k for m in run.marks)) for k in MARK_STYLE)),
        ("wall time, first to last record", _duration(span)),
    ]


def _duration(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 2 * 3600 else f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def html_page(runs: list[Run], png: bytes) -> str:
    """One self-contained page: the figure inline (base64) and a summary table per run."""
    heads = "".join(f"<th>{html.escape(r.name)}</th>" for r in runs)
    sums = [summary(r) for r in runs]
    rows = "".join(
        "<tr><th>" + html.escape(label) + "</th>" + "".join(f"<td>{html.escape(s[i][1])}</td>" for s in sums) + "</tr>"
        for i, (label, _) in enumerate(sums[0])
    )
    img = base64.b64encode(png).decode("ascii")
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>hpctrain report</title>\n'
        "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}img{max-width:100%}</style>"
        "</head><body>\n<h1>hpctrain report</h1>\n"
        f"<table><tr><th>run</th>{heads}</tr>{rows}</table>\n"
        f'<p><img alt="metrics" src="data:image/png;base64,{img}"></p>\n</body></html>\n'
    )


def write(runs: list[Run], out: str | Path, x: str = "both") -> Path:
    """Draw and save: .png (the figure) or .html (figure and tables in one file)."""
    out = Path(out)
    if out.suffix.lower() not in (".png", ".html", ".htm"):
        raise ReportError(f"-o {out}: the report is written as .png or .html")
    png = png_bytes(figure(runs, x))  # a bare Figure: no pyplot state to close
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".png":
        out.write_bytes(png)
    else:
        out.write_text(html_page(runs, png))
    return out
