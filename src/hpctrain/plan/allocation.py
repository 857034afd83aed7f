"""The account's allocation against a job's GPU-hours: one `sshare` (RawUsage, FairShare, GrpTRESRaw,
TRESRunMins, and the GrpTRESMins limit where the site sets one: sshare(1) shows the association's
own), reused for ALLOCATION_CACHE_S. Without an account named, `sshare` with no -a/-A lists the
user's own associations (measured, 22.05: the root account's row, then each account the user is in
and the user's row under it): an only account is the default one; with several, slurmdbd's default
(`sacctmgr show user`) is asked and reused for a day.

GrpTRESMins caps the TRES-minutes of past, present and future jobs of an association and its
children (sacctmgr(1)); what is left is the limit − GrpTRESRaw (used, decayed by
PriorityDecayHalfLife) − TRESRunMins (held by running jobs' remaining time limits) (sshare(1)).
The user's own association's limit wins over its account's. A limit in gres/gpu, node or cpu is
compared with the job's GPU-, node- or CPU-minutes (cpu: the profile's slurm.cpus_per_node); a
limit in billing or another TRES is shown, not compared (its weights are the site's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hpctrain.site.slurm_cli import default_account, tool

ALLOCATION_CACHE_S = 600  # usage moves as jobs run: as long as the queue's answers (plan.queue)
ACCOUNT_CACHE_S = 86400  # an administrator changes a user's default account rarely


def tres(text: str) -> dict[str, float]:
    """`cpu=10,gres/gpu=4` → {name: count}; entries that are not name=number are skipped."""
    out = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Allocation:
    account: str
    user: str
    raw_usage: str = ""  # sshare RawUsage (TRES-seconds, decayed)
    fairshare: str = ""
    limit: dict[str, float] = field(default_factory=dict)  # GrpTRESMins, TRES → minutes
    limit_of: str = ""  # "user root in account a" or "account a"
    used: dict[str, float] = field(default_factory=dict)  # sshare GrpTRESRaw of that association
    running: dict[str, float] = field(default_factory=dict)  # sshare TRESRunMins

    def remaining(self, name: str) -> float | None:
        if name not in self.limit:
            return None
        return self.limit[name] - self.used.get(name, 0.0) - self.running.get(name, 0.0)

    def text(self) -> str:
        head = (
            f"sshare: account {self.account}, user {self.user}: RawUsage {self.raw_usage or '?'}, "
            f"FairShare {self.fairshare or '?'}"
        )
        if not self.limit:
            return head + "; no GrpTRESMins limit (sshare)"
        lims = ", ".join(f"{k}={v:,.0f} min, {self.remaining(k):,.0f} left" for k, v in self.limit.items())
        return head + f"; GrpTRESMins of {self.limit_of} (sshare): {lims}"


def read_allocation(account: str = "", user: str = "") -> Allocation | None:
    """The account's (default: the user's default account) share and limit; None: no answer."""
    user = user or os.environ.get("USER") or os.environ.get("LOGNAME") or "root"
    fields = "Account,User,RawUsage,FairShare,GrpTRESRaw,TRESRunMins,GrpTRESMins"
    if account:
        text = tool("sshare", "-n", "-P", "-a", "-A", account, "-o", fields, cache_s=ALLOCATION_CACHE_S)
    else:  # the user's own associations: each of their accounts' row, then theirs under it (the root's first)
        text = tool("sshare", "-n", "-P", "-o", fields, cache_s=ALLOCATION_CACHE_S)
    if text is None:
        return None
    rows = [[p.strip() for p in ln.split("|")] for ln in text.splitlines() if ln.count("|") == 6]
    if not account:  # one account: it is the default; more: slurmdbd says which (sacctmgr, once a day)
        mine_in = sorted({r[0] for r in rows if r[1] == user})  # none: no association, no default either
        account = mine_in[0] if len(mine_in) == 1 else default_account(user, ACCOUNT_CACHE_S) if mine_in else ""
        if not account:
            return None
    acc_row = next((r for r in rows if r[0] == account and not r[1]), None)
    user_row = next((r for r in rows if r[0] == account and r[1] == user), None)
    user_lim = tres(user_row[6]) if user_row else {}
    acc_lim = tres(acc_row[6]) if acc_row else {}
    mine = user_row or acc_row or ["", "", "", "", "", "", ""]
    if user_lim:
        lim, of, row = user_lim, f"user {user} in account {account}", user_row or mine
    else:
        lim, of, row = acc_lim, f"account {account}", acc_row or mine
    return Allocation(account, user, mine[2], mine[3], lim, of if lim else "", tres(row[4]), tres(row[5]))


def job_minutes(name: str, nodes: int, gpus_per_node: int, cpus_per_node: int, hours: float) -> float | None:
    """The job's minutes of TRES `name` (None: not comparable)."""
    per = {"gres/gpu": nodes * gpus_per_node, "node": nodes, "cpu": nodes * cpus_per_node if cpus_per_node else 0}
    return per[name] * hours * 60 if per.get(name) else None


def share(
    alloc: Allocation | None, nodes: int, gpus_per_node: int, cpus_per_node: int, hours: float
) -> tuple[float | None, str]:
    """(the job's share of what is left of the limit, how): None when there is no comparable limit."""
    if alloc is None:
        return None, "unknown: sshare/sacctmgr do not answer"
    for name in ("gres/gpu", "node", "cpu"):
        need, left = job_minutes(name, nodes, gpus_per_node, cpus_per_node, hours), alloc.remaining(name)
        if need is not None and left is not None:
            if left <= 0:
                return float("inf"), f"{name}: {need:,.0f} min needed, none left of GrpTRESMins"
            return need / left, f"{name}-minutes: needs {need:,.0f} of the {left:,.0f} left"
    if alloc.limit:
        return None, f"limit in {', '.join(alloc.limit)}: not comparable here (site weights)"
    return None, "no GrpTRESMins limit"
