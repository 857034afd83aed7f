"""`hpctrain report` on two real digits runs: one stopped and resumed, one with another lr."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest

from hpctrain.cli import main
from hpctrain.config import load
from hpctrain.watch import report
from tests.helpers import halt_at, run_metrics

SETS = ["train.max_steps=24", "train.eval_every_epochs=1", "log.every=2"]  # evals at 22 (epoch end), 24
HALT = 10


@pytest.fixture(scope="module")
def runs(digits_root, tmp_path_factory):
    """Trained in this process: a subprocess costs ~7 s of CPU to start."""
    from hpctrain.train.entry import run

    d = tmp_path_factory.mktemp("report")

    def train(name: str, *sets: str) -> dict:
        return run(
            load(
                "digits_vit",
                [
                    f"data.root={digits_root}",
                    "data.prepare=none",
                    f"run.dir={d}",
                    f"run.name={name}",
                    "train.threads=1",
                    "ckpt.every=0",
                    "log.trackers=[]",
                    *SETS,
                    *sets,
                ],
            )
        )

    with halt_at(HALT):
        assert train("base")["status"] == "halted"
    assert train("base")["resumed_from"] == HALT
    assert train("lr_x3", "optim.lr=6e-3")["status"] == "finished"
    return d / "base", d / "lr_x3"


def panel_axes(fig, block: int) -> list:
    """The axes of PANELS in one block of rows (0: against step, 1: against wall time)."""
    titled = [ax for ax in fig.axes if ax.get_title()]
    n = len(report.PANELS)
    return titled[block * n : (block + 1) * n]


def has_field(runs, panel) -> bool:
    return any(s.key in r for run in runs for s in panel.series for r in run.of(s.kind))


@pytest.mark.slow
def test_every_panel_has_data_or_says_no_data(runs):
    loaded = [report.load_run(r) for r in runs]
    assert [r.name for r in loaded] == ["base", "lr_x3"]
    fig = report.figure(loaded, "both")
    for block in (0, 1):
        for ax, panel in zip(panel_axes(fig, block), report.PANELS, strict=True):
            assert ax.get_title() == panel.title
            curves = [
                ln
                for ln in ax.get_lines()
                if len(ln.get_xdata()) and ln.get_linestyle() != "None" and ln.get_label().startswith(("base", "lr_x3"))
            ]
            if has_field(loaded, panel):
                assert {ln.get_label().split()[0] for ln in curves} == {"base", "lr_x3"}, panel.title
                assert all(len(ln.get_xdata()) > 0 for ln in curves)
            else:  # fields the speed records add on a GPU (MFU, CUDA memory) are absent on this CPU
                assert [t.get_text() for t in ax.texts] == ["no data"], panel.title
    must = ("train loss", "learning rate", "val accuracy", "throughput", "data wait")
    assert all(has_field(loaded, p) for p in report.PANELS if p.title.startswith(must))
    # the stop of the first attempt is a vertical line at its step, and at its time since start
    stop = run_metrics(runs[0], "stop")[0]
    assert stop["step"] == HALT
    loss_step, loss_wall = panel_axes(fig, 0)[0], panel_axes(fig, 1)[0]
    vlines = [ln for ln in loss_step.get_lines() if list(ln.get_ydata()) == [0, 1]]
    assert [ln.get_xdata()[0] for ln in vlines] == [HALT]
    unit = {"s": 1, "min": 60, "h": 3600}[report._wall_unit(loaded)[0]]
    wall = [ln.get_xdata()[0] for ln in loss_wall.get_lines() if list(ln.get_ydata()) == [0, 1]]
    assert wall == pytest.approx([(stop["time"] - loaded[0].t0) / unit])


@pytest.mark.slow
def test_png_from_the_login_node_cli_and_html(runs, tmp_path):
    import matplotlib.image

    png = tmp_path / "r.png"
    code = (
        "import sys; from hpctrain.cli import main; rc = main(['report', *sys.argv[1:]]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, *map(str, runs), "-o", str(png)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    w, h = report.figure_inches("both", goodput=True)  # runs of this hpctrain: the goodput row too
    assert matplotlib.image.imread(str(png)).shape[:2] == (round(h * report.DPI), round(w * report.DPI))
    page = tmp_path / "r.html"
    assert main(["report", *map(str, runs), "-o", str(page), "--x", "step"]) == 0
    text = page.read_text()
    data = text.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    last = run_metrics(runs[1], "eval")[-1]["top1"]
    assert "<th>base</th><th>lr_x3</th>" in text and f"<td>{last:.2f}</td>" in text
    assert "<tr><th>stops / requeues / restarts</th><td>1 / 0 / 0</td><td>0 / 0 / 0</td></tr>" in text


@pytest.mark.slow
def test_errors_are_one_line(runs, tmp_path, monkeypatch, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert main(["report", str(runs[0]), "-o", str(tmp_path / "r.pdf")]) == 2
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what a login node without the extra raises
    assert main(["report", str(runs[0]), "-o", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("hpctrain: error: ") for e in err)
    assert "no metrics.jsonl for" in err[0] and ".png or .html" in err[1]
    assert "pip install 'hpctrain[report]'" in err[2]


@pytest.mark.slow
def test_a_sweep_stands_for_its_runs(runs, tmp_path):
    """`hpctrain report SWEEP` overlays the members that have metrics (sweep.json of `hpctrain sweep`)."""
    import json

    sweep = tmp_path / "lr-sweep"
    sweep.mkdir()
    members = [
        {"name": "00-a", "run_dir": str(runs[0])},
        {"name": "01-b", "run_dir": str(runs[1])},
        {"name": "02-pending", "run_dir": str(tmp_path / "not-started")},
    ]
    (sweep / "sweep.json").write_text(json.dumps({"members": members}))
    assert report.expand_sweeps([str(sweep), str(runs[1])]) == [
        (str(runs[0]), "00-a"),
        (str(runs[1]), "01-b"),
        (str(runs[1]), None),
    ]
    assert main(["report", str(sweep), "-o", str(tmp_path / "s.html"), "--x", "step"]) == 0
    assert "<th>00-a</th><th>01-b</th>" in (tmp_path / "s.html").read_text()
