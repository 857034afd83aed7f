"""The batch shell's loop over srun steps: hot spare nodes and bad-node exclusion (docs/spares.md).

With `slurm.spare_nodes` K (`--spare-nodes`) the job holds N+K nodes with `--no-kill` and trains
on N of them. When a step fails, the shell names the faulty nodes — the tasks' own reports
(`$HPCTRAIN_BAD_NODES_FILE`, hpctrain.run.badnodes), Slurm's view (a failed node leaves a `--no-kill`
job's NodeList; `scontrol show node` says DOWN/FAIL), one short probe step over the nodes of the
allocation (one task per node: one step for slurmctld to create, not one per node) — and starts
the next step on N healthy nodes without them: the ranks resume from the last checkpoint
(`--resume auto`), with no requeue and no queue wait. A step that failed naming no node (a crashed
or killed rank on a healthy node) runs again on the same nodes, up to `slurm.max_restarts` times per
allocation; the same error at the same step twice, or an error the user must fix, ends the job with
that error instead (restarts.sh). Fewer than N healthy nodes left, or no spares: the job is requeued
and the named nodes go into its ExcNodeList at once (Slurm takes ExcNodeList only while the job is
pending; a requeued job waits cred_expire), for a while and no more of them than the partition can
spare (exclude.sh). Every restart and exclusion is a line of `$HPCTRAIN_FAULTS_FILE` that rank 0
turns into a metrics record
(hpctrain.run.faultlog). Facts and sources: docs/spares.md.
"""

from __future__ import annotations

from hpctrain import shellfile
from hpctrain.run.badnodes import NODE_NAME
from hpctrain.site.profile import BadNodeReport

# badnodes.NODE_NAME for `grep -xE`: the shell passes on no other node name
NODE_ERE = NODE_NAME.pattern


def report_lines(report: BadNodeReport) -> list[str]:
    """slurm.report_bad_node as the shell's values, and the function that reports (report_node.sh)."""
    return [
        "# Each node left out is reported to the site's admins (slurm.report_bad_node; docs/sites.md).",
        shellfile.array("hpctrain_report_cmd", list(report.command)),
        shellfile.assign("hpctrain_report_file", report.file),
        f"hpctrain_report_s={int(report.timeout_s)}",
        *shellfile.lines("report_node.sh"),
    ]


def setup_lines(
    spares: int, tasks_per_node: int, max_restarts: int, report: BadNodeReport | None = None, min_nodes: int = 0
) -> list[str]:
    """Before the first step: how many nodes train, the files, and the shell functions (exclude.sh,
    spares.sh, restarts.sh). `min_nodes` > 0: a node range, whose job goes on with fewer nodes, down to
    that many, when a node is lost and no spare is free (step_next.sh)."""
    return [
        *report_lines(report or BadNodeReport()),
        "# Hot spares (slurm.spare_nodes; HPCTRAIN_SPARE_NODES overrides): the job holds that many nodes more",
        "# than it trains on (#SBATCH --no-kill: a failed node leaves the job instead of ending it). After a",
        "# failed step this shell names the faulty nodes (the tasks' $HPCTRAIN_BAD_NODES_FILE, Slurm's node",
        "# states, one probe step over the nodes) and starts the next step on healthy nodes of the allocation;",
        "# without enough of them it requeues the job with those nodes in its ExcNodeList (docs/spares.md).",
        shellfile.default("hpctrain_spares", int(spares), env="HPCTRAIN_SPARE_NODES"),
        "# A node range (--nodes MIN-MAX; HPCTRAIN_MIN_NODES overrides, 0: none): with no spare free, a lost node's",
        "# job goes on in this allocation on the nodes left, at least this many, at the same global batch.",
        shellfile.default("hpctrain_min_nodes", int(min_nodes), env="HPCTRAIN_MIN_NODES"),
        shellfile.default("hpctrain_tpn", int(tasks_per_node), env="SLURM_NTASKS_PER_NODE", if_empty=True),
        shellfile.assign("hpctrain_node_name", NODE_ERE) + "  # the shell passes on no other node name",
        *shellfile.lines("exclude.sh"),
        *shellfile.lines("spares.sh"),
        "# In-job restarts (slurm.max_restarts; HPCTRAIN_MAX_RESTARTS overrides): a step that failed naming no",
        "# faulty node runs again on the same nodes from the last checkpoint, unless it failed the same way at",
        "# the same step before (docs/spares.md).",
        shellfile.default("hpctrain_max_restarts", int(max_restarts), env="HPCTRAIN_MAX_RESTARTS"),
        *shellfile.lines("restarts.sh"),
    ]


def guard_lines() -> list[str]:
    """Spare mode: a step on another node that requeues the job when the batch host dies. Measured
    (22.05): a --no-kill job whose batch host dies stays RUNNING on its other nodes without a batch
    script, also after the node is back, until its time limit; a guard step there sees the node
    DOWN (after SlurmdTimeout) and requeues it; a node that is only NOT_RESPONDING, draining or
    failing is left alone. It asks Slurm (`sinfo -n`, one node) only while the batch shell's heartbeat
    stands still, else once a minute (docs/spares.md, "What the batch shell costs slurmctld")."""
    return shellfile.lines("guard.sh")
