# shellcheck shell=bash
# summary: before each step: recheck the snapshot, skip the step after a stop signal, set its srun options
# hpctrain_step_start: 1 when no step may start (hpctrain_decision and hpctrain_why say why)
hpctrain_step_start() {
  local healthy
  # a stop signal that came before this step (the image copy, a probe step: the trap acted at once, but
  # no step ran to pass it to): no step starts; the job is requeued and resumes from the last checkpoint
  if [ -n "$hpctrain_signal" ]; then
    hpctrain_rc=0 hpctrain_decision=requeue
    hpctrain_why="a stop signal (SIG$hpctrain_signal) came before the step started: requeued, to resume from the last checkpoint"
    return 1
  fi
  hpctrain_step_hosts=$hpctrain_alloc
  if [ "$hpctrain_no_kill" = 1 ]; then
    hpctrain_out healthy hpctrain_healthy  # a trapped signal acts at once (signals.sh)
    hpctrain_step_hosts=" $(printf '%s\n' "$healthy" | head -n "$hpctrain_train_nodes" | tr "\n" " ")"
    # --overlap: a failed step stays RUNNING in slurmctld while its lost node cannot confirm its end,
    # holding its CPUs and GPUs on the healthy nodes too (measured); its tasks are gone, so share them
    # --ntasks-per-node: a range's allocation has none to inherit (sbatch.py asks --mincpus there)
    hpctrain_step=(--nodes="$hpctrain_train_nodes" --ntasks=$((hpctrain_train_nodes * hpctrain_tpn))
                   --ntasks-per-node="$hpctrain_tpn" --nodelist="$(hpctrain_commas "$hpctrain_step_hosts")" --overlap)
  fi
  export HPCTRAIN_ATTEMPT=$hpctrain_attempt
  HPCTRAIN_STEP_AT=$(date +%s.%N) && export HPCTRAIN_STEP_AT  # the step's launch, for the ledger (run/startup.py)
  hpctrain_check_snapshot  # source.sh: an in-job restart imports the snapshot again
  # healthy spares beyond this step's nodes: a straggler stop then restarts here, not a requeue (run/requeue.py)
  export HPCTRAIN_SPARES_FREE=0
  if [ "$hpctrain_spares" -gt 0 ]; then HPCTRAIN_SPARES_FREE=$(( $(printf '%s\n' "$healthy" | grep -c .) - hpctrain_train_nodes )); fi
  rm -f "$HPCTRAIN_STOP_FILE" "$HPCTRAIN_BAD_NODES_FILE" "$HPCTRAIN_CRASH_FILE"
}
