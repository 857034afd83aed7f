# shellcheck shell=bash
# summary: wait for the step through trapped signals, then read rank 0's decision from the stop file
# hpctrain_step_wait: right after the step started in the background ($! is its srun)
hpctrain_step_wait() {
  hpctrain_srun=$!
  hpctrain_wait "$hpctrain_srun"; hpctrain_rc=$?  # through trapped signals (signals.sh)
  hpctrain_decision="" hpctrain_why=""
  if [ -f "$HPCTRAIN_STOP_FILE" ]; then
    { read -r hpctrain_decision; read -r hpctrain_why; } < "$HPCTRAIN_STOP_FILE" || true
  elif [ "$hpctrain_rc" != 0 ] && { [ -n "$hpctrain_signal" ] || hpctrain_preempted; }; then
    hpctrain_decision=requeue
    hpctrain_why="the tasks ended (exit $hpctrain_rc) after a stop signal before their own checkpoint: resuming from the last one"
  fi
}
