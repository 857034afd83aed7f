# shellcheck shell=bash
# summary: in-job restarts after a step that failed on healthy nodes (slurm.max_restarts)
# In-job restarts after a step that failed naming no faulty node (a rank crashed or was killed;
# every node still answers its probe): the next step runs on the same nodes, from the last
# checkpoint, up to $hpctrain_max_restarts times in this allocation. Each rank that fails writes
# one line to $HPCTRAIN_CRASH_FILE (hpctrain.launch.failure): time, rank, node, step, kind, error;
# the first to fail is the cause. The same error at the same step twice in a row (or, where no rank
# said why, the same exit status) is a bug, not a fault, and an error the user must fix (kind
# `user`) is not retried: both end the job with that error.
hpctrain_first_crash() {  # the line of the rank that failed first (its time, in ns, is the first field)
  if [ -s "$HPCTRAIN_CRASH_FILE" ]; then sort -n -k1,1 "$HPCTRAIN_CRASH_FILE" | head -n 1; fi
}
hpctrain_restart_here() {  # after a failed step that named no node: 0 restart it here, 1 end the job
  local crash t rank node step kind err cause sig
  crash=$(hpctrain_first_crash)
  IFS=$'\t' read -r t rank node step kind err <<< "$crash"
  if [ -n "$crash" ]; then cause="rank $rank on $node in step $step: $err" sig="$step"$'\t'"$err"
  else  # the exit status stands for the error
    cause="no rank said why (killed by a signal, or failed before hpctrain started: see the task logs)"
    sig="exit $hpctrain_rc"
  fi
  cause=$(printf '%s' "$cause" | tr -d '\000-\037')
  hpctrain_new="" hpctrain_fault="exit $hpctrain_rc: $cause"
  if [ "$kind" = user ]; then
    echo "hpctrain: the step failed (exit $hpctrain_rc): $cause. A restart cannot fix this: not restarting" >&2
    return 1
  fi
  if [ "$sig" = "$hpctrain_last_crash" ]; then
    echo "hpctrain: the step failed twice in a row the same way ($hpctrain_fault)." \
      "A bug, not a fault: not restarting" >&2
    return 1
  fi
  hpctrain_last_crash=$sig
  if [ "$hpctrain_restarts" -ge "$hpctrain_max_restarts" ]; then
    echo "hpctrain: the step failed (exit $hpctrain_rc): $cause. It was restarted $hpctrain_restarts time(s)" \
      "in this job already (slurm.max_restarts=$hpctrain_max_restarts): not restarting" >&2
    return 1
  fi
  hpctrain_restarts=$((hpctrain_restarts + 1)) hpctrain_attempt=$((hpctrain_attempt + 1))
  hpctrain_record restart
  echo "hpctrain: step failed (exit $hpctrain_rc) at $(date +%T) with no faulty node: $cause." \
    "Restart $hpctrain_restarts/$hpctrain_max_restarts in this job on the same nodes, from the last checkpoint" >&2
}
# hpctrain_setup_restarts: the restart count and the crash file
hpctrain_setup_restarts() {
  case "$hpctrain_max_restarts" in
    ''|*[!0-9]*) echo "hpctrain: HPCTRAIN_MAX_RESTARTS ($hpctrain_max_restarts) must be a whole number" >&2; exit 1 ;;
  esac
  export HPCTRAIN_CRASH_FILE="$HPCTRAIN_CONTROL_DIR/crash-${SLURM_JOB_ID:-none}"
  hpctrain_restarts=0 hpctrain_last_crash=""
}
