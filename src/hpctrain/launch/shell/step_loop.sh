# shellcheck shell=bash
# summary: the training steps: srun one until it ends without naming a faulty node (launch.inplace)
# hpctrain_step_loop OPTION... COMMAND...: srun's options for the step (hpctrain_step_bind's before them,
# then the step's nodes, hpctrain_step, and the runtime's HPCTRAIN_SRUN_CONTAINER) and the tasks' command.
# --open-mode=append: srun truncates the per-task logs when a step starts unless told to append (srun(1)
# --open-mode; slurm.conf JobFileAppend), so a requeued or restarted attempt would erase the traceback of
# the one that failed (tests/faults/test_node_death.py).
hpctrain_step_loop() {
  set +e
  while hpctrain_step_start; do
    # hpctrain_slurm -b (slurm_call.sh): logged as it starts, a child of this shell that takes its signals
    hpctrain_slurm -b srun --kill-on-bad-exit=1 --unbuffered --open-mode=append \
      ${hpctrain_step_bind[@]+"${hpctrain_step_bind[@]}"} ${hpctrain_step[@]+"${hpctrain_step[@]}"} \
      "${HPCTRAIN_SRUN_CONTAINER[@]}" "$@"
    hpctrain_step_wait
    hpctrain_step_next || break
  done
  set -e
}
