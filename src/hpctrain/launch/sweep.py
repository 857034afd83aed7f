"""Sweeps: many runs of one config, as one Slurm job array (submitit) or one after another locally.

Every member is a whole run of its own: `runs/<sweep>/<member>/` with its overrides in the name,
its own job id (`<array>_<i>`; Slurm gives each array element its own `SLURM_JOB_ID` as well),
so its own stop file, requeue, restart count and resume, exactly as a single run's
(docs/sweeps.md). `sweep.json` in the sweep directory records the members. Every member's config
is loaded and checked before anything is written or submitted: one bad member refuses the
sweep. Imports no torch (login nodes).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.config import Config, ConfigError, load, read_yaml, to_dict
from hpctrain.data.prep.prepare import ensure_dataset
from hpctrain.errors import LaunchError, UserError
from hpctrain.launch import submitit_glue as glue
from hpctrain.launch.private import private_dir
from hpctrain.launch.submit import (
    absolute_paths,
    job_snapshot,
    slurm_script,
    slurm_spec,
    submit_local,
    wait_local,
    write_job_record,
)
from hpctrain.launch.task import train_task
from hpctrain.run.layout import METRICS, SUBMITIT, read_json
from hpctrain.run.metrics import read_metrics
from hpctrain.site.slurm_cli import queue_state, slurm_config
from hpctrain.watch.jobinfo import job_state, sacct_rows

DEFAULT_MAX_RUNS = 64
SWEEP_FILE = "sweep.json"
RESERVED = ("run.dir", "run.name")  # the sweep sets them per member


@dataclass(frozen=True)
class Member:
    index: int
    name: str
    overrides: list[str]  # this member's own key=value, applied after the sweep's --set
    cfg: Config


def split_values(text: str) -> list[str]:
    """`1e-3,5e-4` → two values; commas inside [] or {} stay (a list value is one value)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def value_text(v) -> str:
    """A YAML value of a sweep file as the `key=value` text `--set` takes."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """`--grid key=v1,v2` (repeatable) → {key: [v1, v2]}."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        vals = [v for v in split_values(values)] if sep else []
        if not key or not sep or not values.strip() or any(v == "" for v in vals):
            raise ConfigError(
                f"--grid {item!r}: write key=value1,value2 (e.g. optim.lr=1e-3,5e-4), "
                "with at least one value and no empty one"
            )
        if key in grid:
            raise ConfigError(f"--grid {key} given twice: put all its values in one --grid")
        grid[key] = vals
    return grid


def read_sweep_file(path: str | Path) -> tuple[dict[str, list[str]], list[list[str]]]:
    """`grid: {key: [values]}` and/or `runs: [{key: value, …} or ["key=value", …]]`."""
    data = read_yaml(path) or {}
    unknown = set(data) - {"grid", "runs"}
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown section(s) {sorted(unknown)}: use grid: and/or runs:")
    grid: dict[str, list[str]] = {}
    for key, values in (data.get("grid") or {}).items():
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ConfigError(f"sweep file {path}: grid key {key} has no values")
        grid[str(key)] = [value_text(v) for v in values]
    runs = []
    for i, r in enumerate(data.get("runs") or []):
        if isinstance(r, dict):
            runs.append([f"{k}={value_text(v)}" for k, v in r.items()])
        elif isinstance(r, list) and all(isinstance(x, str) and "=" in x for x in r):
            runs.append(list(r))
        else:
            raise ConfigError(
                f"sweep file {path}: runs[{i}] must be a mapping of key: value or a list of 'key=value' strings"
            )
    return grid, runs


def expand(grid: dict[str, list[str]], runs: Sequence[Sequence[str]] = ()) -> list[list[str]]:
    """The members' overrides: every point of the grid (first key slowest), then the listed runs."""
    keys = list(grid)
    points = [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*grid.values())] if keys else []
    return points + [list(r) for r in runs]


def member_name(index: int, overrides: Sequence[str]) -> str:
    """`02-lr5e-4_drop_path0.1`: the index, then each override's last key part and value, kept to
    characters safe in a path component (the index keeps names unique)."""
    parts = []
    for o in overrides:
        key, _, value = o.partition("=")
        parts.append(key.rsplit(".", 1)[-1] + value)
    text = re.sub(r"[^A-Za-z0-9_.+-]", "", "_".join(parts))[:80]
    return f"{index:02d}-{text}" if text else f"{index:02d}"


def plan_members(
    config: str | None,
    base_overrides: Sequence[str],
    sets: Sequence[Sequence[str]],
    sweep_dir: Path,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> list[Member]:
    """Load and check every member's config: the first bad one fails the whole sweep, named."""
    if not sets:
        raise ConfigError("the sweep is empty: give --grid key=v1,v2 (repeatable) or --sweep-file with a grid or runs")
    if len(sets) > max_runs:
        raise ConfigError(
            f"the sweep has {len(sets)} members, more than --max-runs {max_runs}: pass "
            f"--max-runs {len(sets)} if that many runs are meant"
        )
    members = []
    for i, o in enumerate(sets):
        for item in o:
            if item.partition("=")[0].strip() in RESERVED:
                raise ConfigError(
                    f"sweep member {i} ({' '.join(o)}): {item.partition('=')[0]} is set by the sweep "
                    f"(runs/<sweep>/<member>); set it with --set for the whole sweep"
                )
        name = member_name(i, o)
        try:
            cfg = load(config, [*base_overrides, *o, f"run.dir={sweep_dir}", f"run.name={name}"])
        except ConfigError as e:
            raise ConfigError(f"sweep member {i} ({' '.join(o)}): {e}") from None
        if cfg.compile.enabled and not cfg.compile.cache:  # one for the sweep: members with one model share it
            cfg = dataclasses.replace(
                cfg,
                compile=dataclasses.replace(cfg.compile, cache=str(Path(sweep_dir).resolve() / "compile_cache")),
            )
        members.append(Member(i, name, list(o), cfg))
    return members


def write_record(sweep_dir: Path, record: dict) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    tmp = sweep_dir / (SWEEP_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(sweep_dir / SWEEP_FILE)


def new_record(
    name: str, config: str | None, base_overrides: Sequence[str], members: Sequence[Member], executor: str
) -> dict:
    return {
        "name": name,
        "config": config,
        "overrides": list(base_overrides),
        "executor": executor,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "job_id": None,
        "members": [
            {"index": m.index, "name": m.name, "overrides": m.overrides, "run_dir": str(m.cfg.run_dir), "job_id": None}
            for m in members
        ],
    }


def check_new(sweep_dir: Path) -> None:
    if (sweep_dir / SWEEP_FILE).exists():
        raise UserError(
            f"sweep {sweep_dir} exists already ({SWEEP_FILE}): pick another --name, or see it with "
            f"`hpctrain status {sweep_dir}`"
        )


# --------------------------------------------------------------------------- submission

DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf(5) MaxArraySize's default


def check_array_size(members: int) -> None:
    """Refuse a sweep the cluster cannot hold as one array before any member is prepared: slurm.conf(5)
    "The maximum job array task index value will be one less than MaxArraySize", and the array is
    `0-(members-1)` (`scontrol show config`; skipped when scontrol does not answer)."""
    conf = slurm_config()
    if conf is None:
        return
    value = conf.get("MaxArraySize", "")
    limit = int(value) if value.isdigit() else DEFAULT_MAX_ARRAY_SIZE
    if members <= limit:
        return
    if limit == 0:  # "Configure MaxArraySize to 0 in order to disable job array use"
        raise UserError(
            "this cluster has job arrays off (MaxArraySize=0, `scontrol show config`): a sweep is one job "
            f"array; submit its {members} members one by one with `hpctrain submit`"
        )
    raise UserError(
        f"the sweep has {members} members (array indices 0-{members - 1}) but this cluster's MaxArraySize is "
        f"{limit} (indices below {limit}, `scontrol show config`): sweep fewer members, or split the grid into "
        f"sweeps of at most {limit}"
    )


def array_plan(plans: Sequence, members: Sequence[Member], sweep_dir: Path, name: str, max_parallel: int):
    """One JobPlan for the array: the members' shared resources, element i in member i's run dir,
    at most `max_parallel` elements at a time (`--array=0-(n-1)%K`)."""
    first = plans[0]
    binds = list(dict.fromkeys(b for p in plans for b in p.binds))
    return dataclasses.replace(
        first,
        job_name=name,
        array=f"0-{len(members) - 1}%{max(1, min(max_parallel, len(members)))}",
        workdirs=[str(m.cfg.run_dir) for m in members],
        binds=binds,
        chdir=str(sweep_dir),
        output=str(sweep_dir / SUBMITIT / "%A_%a_0_log.out"),
    )


def submit_array(members: Sequence[Member], plan, sweep_dir: Path, record: dict):
    """Submit the array through submitit (its `map_array`, with our batch script: launch.submitit_glue);
    write each member's job.json and the sweep record. Returns the array's job id and the code snapshot.

    One snapshot for the sweep (`<sweep>/code/<hash>`), shared by its elements: they are one
    array job with one batch script, so they run the same code by construction."""
    folder = private_dir(sweep_dir / SUBMITIT)
    snap = job_snapshot(plan, folder)
    cfgs = [to_dict(absolute_paths(m.cfg)) for m in members]
    for m in members:
        m.cfg.run_dir.mkdir(parents=True, exist_ok=True)  # element i starts there (cd in the script)
    try:
        jobs = glue.slurm_array(slurm_spec(plan, folder, slurm_script(plan, folder, "%A_%a", snap)), train_task, cfgs)
    except glue.SUBMIT_ERRORS as e:
        raise LaunchError(f"sbatch refused the sweep: {str(e).strip().splitlines()[-1]}") from None
    array_id = jobs[0].job_id.split("_")[0]
    record["job_id"] = array_id
    record["code"] = str(snap.path) if snap else None
    for m, job, rec in zip(members, jobs, record["members"]):
        rec["job_id"] = job.job_id
        write_job_record(
            m.cfg.run_dir,
            {
                "job_id": job.job_id,
                "executor": "slurm",
                "cluster": plan.profile.name,
                "nodes": plan.nodes,
                "tasks_per_node": plan.tasks_per_node,
                "submitit": str(folder),
                "sweep": str(sweep_dir),
                "code": record["code"],
            },
        )
    write_record(sweep_dir, record)
    return array_id, snap


def run_local(members: Sequence[Member], sweep_dir: Path, record: dict, tasks: int, out) -> list[str]:
    """No Slurm: the members one after another through submitit's local executor. The statuses."""
    write_record(sweep_dir, record)
    statuses = []
    for m, rec in zip(members, record["members"]):
        ensure_dataset(m.cfg)
        sub = submit_local(m.cfg, tasks=tasks)
        rec["job_id"] = sub.job_id
        write_record(sweep_dir, record)
        print(f"member {m.index} ({m.name}): local job {sub.job_id}", file=out, flush=True)
        try:
            status = wait_local(sub)[0].get("status", "?")
        except Exception as e:  # a failed member does not stop the others
            status = f"failed ({type(e).__name__})"
        statuses.append(status)
        if status == "interrupted":  # a Ctrl-C stopped this member (launch.localjob): the sweep ends here
            print(
                f"sweep interrupted at member {m.index} ({m.name}); its later members did not start",
                file=out,
                flush=True,
            )
            break
    return statuses


# --------------------------------------------------------------------------- status


def is_sweep(target: str | Path) -> bool:
    return (Path(target) / SWEEP_FILE).is_file()


def member_metrics(run_dir: Path) -> dict:
    """Last step, best and last val top-1, last images/s, and how the run ended (metrics.jsonl)."""
    out: dict = {"step": None, "top1_best": None, "top1_last": None, "images_per_s": None, "end": None}
    for rec in read_metrics(run_dir / METRICS):
        kind = rec.get("kind")
        if kind == "train":
            out["step"] = rec.get("step")
            out["images_per_s"] = rec.get("images_per_s", out["images_per_s"])
        elif kind == "eval" and rec.get("top1") is not None:
            out["top1_last"] = rec["top1"]
            out["top1_best"] = max(rec["top1"], out["top1_best"] or rec["top1"])
        elif kind == "end":
            out["end"] = rec.get("status")
    return out


def sweep_status(sweep_dir: str | Path) -> list[dict]:
    """One row per member: name, overrides, Slurm state (sacct; local runs: their end record),
    requeues, step, best and last top-1, images/s; sorted by best top-1 (runs without one last)."""
    rec = read_json(Path(sweep_dir) / SWEEP_FILE, {})
    rows = []
    for m in rec.get("members", []):
        run = Path(m["run_dir"])
        met = member_metrics(run)
        job = m.get("job_id")
        state, requeues = "PENDING" if job else "NOT SUBMITTED", 0
        if job and rec.get("executor") == "slurm":
            runs = sacct_rows(job)  # a pending element may show as its array's row: squeue first
            state = queue_state(job) or (runs[-1]["State"] if runs else job_state(job))
            requeues = max(0, len(runs) - 1)
        elif job:
            state = {"finished": "COMPLETED", None: "RUNNING"}.get(met["end"], str(met["end"]).upper())
        rows.append(
            {
                "run": m["name"],
                "overrides": m["overrides"],
                "job_id": job,
                "state": state,
                "requeues": requeues,
                "run_dir": str(run),
                **met,
            }
        )
    rows.sort(key=lambda r: (r["top1_best"] is None, -(r["top1_best"] or 0.0), r["run"]))
    return rows


def sweep_table(rows: Sequence[dict], title: str) -> str:
    """The rows as a fixed-width text table."""

    def pct(x):
        return "-" if x is None else f"{x:.2f}"

    head = ("run", "overrides", "state", "requeues", "step", "top-1 best", "top-1 last", "images/s")
    body = [
        (
            r["run"],
            " ".join(r["overrides"]) or "-",
            r["state"],
            str(r["requeues"]),
            "-" if r["step"] is None else str(r["step"]),
            pct(r["top1_best"]),
            pct(r["top1_last"]),
            "-" if r["images_per_s"] is None else f"{r['images_per_s']:.0f}",
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    fmt = lambda cols: "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()
    return "\n".join([title, fmt(head), *map(fmt, body)])
