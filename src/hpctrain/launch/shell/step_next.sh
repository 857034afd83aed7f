# shellcheck shell=bash
# summary: after a step: leave out the nodes it named, restart, or end the loop
# hpctrain_step_next: 0 to start the next step (a restart here), 1 when the steps are over
hpctrain_step_next() {
  local left need nodes action on
  hpctrain_ended="" hpctrain_new=""
  hpctrain_now hpctrain_ended  # the step's end, with microseconds: the restart test's phase table
  # a failed step (or a stop the tasks asked to requeue): did it name nodes? None named: as before
  if [ "$hpctrain_decision" != end ] &&
     { [ "$hpctrain_rc" != 0 ] || [ "$hpctrain_decision" = requeue ]; }; then
    hpctrain_name_faults
  fi
  if [ -z "$hpctrain_new" ]; then
    # none named after a failure of the tasks' own (no stop, no preemption, the job still running):
    # restart on the same nodes (restarts.sh), or end as the step did
    if [ "$hpctrain_rc" != 0 ] && [ -z "$hpctrain_decision" ] && [ -z "$hpctrain_signal" ] && ! hpctrain_preempted &&
       [ "$(hpctrain_job_field JobState)" = RUNNING ] && hpctrain_restart_here; then
      return 0
    fi
    return 1
  fi
  hpctrain_bad="$hpctrain_bad$hpctrain_new" hpctrain_bad_why="${hpctrain_bad_why:+$hpctrain_bad_why; }$hpctrain_fault"
  hpctrain_exclude_add "$hpctrain_new" "$hpctrain_fault"
  left=$(hpctrain_healthy | wc -l)
  if [ -z "$hpctrain_signal" ] && ! hpctrain_preempted; then
    nodes="" action="" on=""
    if [ "$hpctrain_spares" -gt 0 ] && [ "$left" -ge "$hpctrain_train_nodes" ]; then
      nodes=$hpctrain_train_nodes action=restart
      on="on $nodes of $left healthy nodes, from the last checkpoint"
    # a node range with no spare free: go on with the nodes left, MIN at least, at the same global batch
    # (the tasks split it over the new world size; run/resize.py records the change)
    elif [ "$hpctrain_min_nodes" -gt 0 ] && [ "$left" -ge "$hpctrain_min_nodes" ] && [ "$left" -lt "$hpctrain_train_nodes" ]; then
      nodes=$left action=shrink
      on="on $left node(s) instead of $hpctrain_train_nodes, from the last checkpoint, at the same global batch"
      hpctrain_fault="$hpctrain_fault; no spare free: going on with $left of $hpctrain_train_nodes nodes (node range, at least $hpctrain_min_nodes)"
    fi
    if [ -n "$nodes" ]; then
      hpctrain_attempt=$((hpctrain_attempt + 1))
      hpctrain_record "$action"
      echo "hpctrain: step failed (exit $hpctrain_rc) at $(date +%T); faulty: $hpctrain_fault. Restart $hpctrain_attempt" \
        "in this job $on" >&2
      hpctrain_train_nodes=$nodes
      return 0
    fi
  fi
  need=$hpctrain_train_nodes
  if [ "$hpctrain_min_nodes" -gt 0 ]; then need=$hpctrain_min_nodes; fi
  echo "hpctrain: faulty: $hpctrain_fault; $left healthy node(s) left of the $need needed:" \
    "requeueing without them" >&2
  if [ "$hpctrain_decision" != requeue ]; then  # this shell's own requeue: slurm.max_requeues caps it (requeue.sh)
    hpctrain_decision=requeue hpctrain_by_shell=1
    hpctrain_why="the step failed (exit $hpctrain_rc) on faulty node(s): $hpctrain_fault"
  fi
  return 1
}
