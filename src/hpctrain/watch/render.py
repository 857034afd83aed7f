"""`hpctrain status` as text: the table of a run's `RunStatus` (watch/summary.py) and the words for
its ETA, steps killed for memory, straggler, hang and divergence. No torch: this runs on login nodes.
"""

from __future__ import annotations

from hpctrain.run import goodput, resize
from hpctrain.run.metrics import table
from hpctrain.watch.progress import Eta, duration, iso
from hpctrain.watch.steps import Step, size_text
from hpctrain.watch.summary import RunStatus

STOP_WORDS = {  # a stop record's kind, as `status` says it
    "interrupt": "after Ctrl-C",
    "halt": "at HPCTRAIN_HALT_AT (a test's halt)",
    "time_limit": "after a time limit (USR2)",
    "preemption": "after preemption (TERM)",
    "nonfinite": "after a divergence",
}


def status_text(st: RunStatus) -> str:
    """`hpctrain status`'s table of a run."""
    m, f = st.metrics, st.facts()
    state = st.state
    if m.get("stopped_at") is not None and not m.get("not_requeued"):  # last word: a stop, not an end
        state += f" (stopped at step {m['stopped_at']}: {m.get('stop_reason')}, not resumed yet)"
    if m.get("not_requeued"):
        state += f" (stopped at step {m['not_requeued'][0]} and not requeued: {m['not_requeued'][1]})"
    if st.oom and state != st.oom[-1].state:
        state += f" (step {st.oom[-1].step_id} {st.oom[-1].state})"
    requeues = str(st.requeues)
    kinds = m.get("stop_kinds") or {}
    local = st.executor in ("local", "none")  # no scheduler: each resume follows a stop of the run's own
    if st.requeues and local:
        requeues += " (" + ", ".join(f"{n} {STOP_WORDS.get(k, k)}" for k, n in sorted(kinds.items())) + ")"
    elif st.requeues:
        pre, tl = m.get("preemptions", 0), m.get("time_limits", 0)
        mine = kinds.get("interrupt", 0) + kinds.get("halt", 0)
        requeues += (
            f" ({pre} after preemption, {tl} after a time limit, "
            + (f"{mine} after Ctrl-C or HPCTRAIN_HALT_AT, " if mine else "")
            + f"{max(0, st.requeues - pre - tl - mine)} other: node failure or outside requeue)"
        )
    rows = [
        ("state", state),
        ("job", f"{st.job_id or '-'} ({st.executor})"),
        ("run directory", str(st.run_dir or "-")),
        ("stops" if local else "requeues", requeues),
    ]
    if st.accounting:
        rows.append(("accounting", st.accounting))
    if st.nodes:
        rows.append(("nodes", st.nodes))
    if m.get("restarts"):
        r = m["last_restart"]
        last = f"attempt {r.get('attempt')} of job {r.get('job')}"
        if r.get("fewer_nodes"):  # a node range: the job went on with the nodes left (no spare free)
            where, last = "on fewer nodes", f"{last} without {','.join(r.get('nodes') or [])}"
        elif r.get("nodes"):  # the batch shell left faulty nodes out: a spare took their place
            where, last = "on spare nodes", f"{last} without {','.join(r['nodes'])}"
        else:  # a crashed rank on a healthy node (launch/shell/restarts.sh)
            where = "on the same nodes"
        rows.append(("restarts", f"{m['restarts']} in the job {where} (last: {last}: {r.get('why')})"))
    if m.get("resizes"):
        r = m["last_resize"]
        rows.append(("resized", f"{m['resizes']} time(s) (last, at step {r.get('step')}: {resize.text(r)})"))
    if st.oom:
        rows.append(("out of memory", oom_text(st.oom, m.get("memory"))))
    if m.get("excluded"):
        rows.append(("excluded", "; ".join(f"{n} ({why})" for n, why in m["excluded"].items())))
    if st.goodput:
        rows.append(("time went to", goodput.one_line(st.goodput)))
    if m.get("step") is not None:
        total = f"/{st.total_steps} ({100 * m['step'] / st.total_steps:.0f} %)" if st.total_steps else ""
        ago = f", logged {duration(f['last_record_age_s'])} ago" if f["last_record_age_s"] is not None else ""
        rows.append(("last step", f"{m['step']}{total}, epoch {m.get('epoch') or 0:.2f}{ago}"))
    if m.get("loss") is not None:
        rows.append(("train loss", f"{m['loss']:.4f}"))
    elif m.get("loss_nonfinite"):
        rows.append(("train loss", f"{m['loss_nonfinite']} (not finite)"))
    speed = [f"{m['images_per_s']:.0f} images/s"] if m.get("images_per_s") is not None else []
    if st.steps_per_s:
        speed.append(f"{st.steps_per_s:.3g} steps/s")
    if m.get("mfu") is not None:
        speed.append(f"MFU {100 * m['mfu']:.1f} %")
    if speed:
        rows.append(("speed", ", ".join(speed)))
    rows.append(("ETA", eta_text(st.eta)))
    if m.get("straggler"):
        rows.append(("straggler", straggler_text(m["straggler"])))
    if m.get("hang"):
        rows.append(("hang", hang_text(m["hang"])))
    if m.get("nonfinite"):
        rows.append(("divergence", divergence_text(m)))
    ev = m.get("last_eval")
    if ev:
        text = f"top-1 {ev['top1']:.2f} %, top-5 {ev.get('top5', float('nan')):.2f} % at step {ev.get('step')}"
        if ev.get("ema_top1") is not None:
            text += f" (EMA top-1 {ev['ema_top1']:.2f} %)"
        rows.append(("last eval", text))
    if m.get("checkpoint"):
        age = f", {duration(f['checkpoint_age_s'])} ago" if f["checkpoint_age_s"] is not None else ""
        rows.append(("checkpoint", f"{m['checkpoint']} (step {m.get('checkpoint_step')}{age})"))
    return table(rows, "hpctrain status")


def eta_text(e: Eta) -> str:
    if e.note == "finished":
        return f"finished at {iso(e.at)}" if e.at else "finished"
    if e.seconds is None:
        return e.note
    return f"{duration(e.seconds)} (at {iso(e.at)})" + (f", {e.note}" if e.note else "")


def oom_text(steps: list[Step], memory: dict | None) -> str:
    """The steps killed for memory, each with its peak (sacct), and the run's last memory record."""
    text = "; ".join(s.text() for s in steps)
    if memory:
        parts = [f"host RSS {size_text(memory['host_rss_gb'] * (1 << 30))}"] if memory.get("host_rss_gb") else []
        if memory.get("mem_reserved_gb") is not None:
            parts.append(f"GPU peak {size_text(memory['mem_reserved_gb'] * (1 << 30))} reserved")
        if parts:
            text += f"; last recorded by rank 0 at step {memory.get('step')}: {', '.join(parts)}"
    return text


def straggler_text(s: dict) -> str:
    where = ", ".join(
        x
        for x in (f"host {s['host']}" if s.get("host") else "", f"GPU {s['gpu']}" if s.get("gpu") is not None else "")
        if x
    )
    cause = s.get("cause") or "?"
    if cause == "data" and s.get("data_wait_s") is not None:
        cause += f" (waits {s['data_wait_s']:.3g} s per step for data)"
    pct = s.get("slower_pct")
    return (
        f"rank {s.get('rank')}"
        + (f" ({where})" if where else "")
        + (f" {pct:.0f} % slower than the median" if pct is not None else "")
        + f" at step {s.get('step')}: {cause}"
    )


def divergence_text(m: dict) -> str:
    """Non-finite losses and spikes, and what the run did about the last one (train/health/guard.py)."""
    ev, rb = m["last_nonfinite"], m.get("last_rollback")
    text = f"{m['nonfinite']} event(s), {m.get('rollbacks', 0)} rollback(s); last: {ev['reason']} at step {ev['step']}"
    if rb and rb.get("from_step") == ev["step"]:
        text += f", rolled back to step {rb['step']} ({rb['checkpoint']}), {rb['skip_batches']} batches skipped"
    return text


def hang_text(h: dict) -> str:
    ranks = h.get("ranks") or []
    where = h.get("where") or [None] * len(ranks)
    named = ", ".join(f"rank {r}" + (f" at {w}" if w else "") for r, w in zip(ranks, where))
    files = h.get("files") or []
    more = f" (+{len(files) - 3})" if len(files) > 3 else ""
    return f"at step {h.get('step')}: {named or 'no rank named'} not at the latest step" + (
        f"; dumps: {', '.join(files[:3])}{more}" if files else ""
    )
