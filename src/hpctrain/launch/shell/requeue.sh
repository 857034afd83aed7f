# shellcheck shell=bash
# summary: after the last step: requeue the job or end it, as rank 0 or the stop decided
# hpctrain_requeue_or_end: ends the script (the job's exit status)
hpctrain_requeue_or_end() {
  case "$hpctrain_decision" in
    requeue)
      trap '' USR2 TERM  # scontrol requeue ends this shell with SIGTERM
      hpctrain_state=$(hpctrain_job_field JobState)
      hpctrain_restarts=$(hpctrain_job_field Restarts)
      # only this attempt's own allocation: a job Slurm requeued already (same id, a later restart) is not ours
      if [ "$hpctrain_state" != RUNNING ] || [ "${hpctrain_restarts:-0}" != "${SLURM_RESTART_COUNT:-0}" ]; then
        echo "hpctrain: job ${hpctrain_job} is ${hpctrain_state:-gone} (restart ${hpctrain_restarts:-?}) already: Slurm requeues or ends it itself"
        exit 0
      fi
      echo "hpctrain: $hpctrain_why"
      if hpctrain_preempted; then  # asked once: each asks slurmctld
        hpctrain_count_preemption
        if hpctrain_slurm_requeues_preempted; then
          echo "hpctrain: preempted under PreemptMode=REQUEUE: Slurm $(scontrol --version | sed 's/.* //') requeues the job itself as this shell ends"
          exit 0
        fi
        if hpctrain_marks_preempted; then
          echo "hpctrain: Slurm $(scontrol --version | sed 's/.* //') keeps its preemption mark on job $hpctrain_job" \
            "after this requeue (preempt mode $(hpctrain_preempt_mode)): it will record the job's end PREEMPTED," \
            "even a finished run's; hpctrain status reads the run's own end"
        fi
      fi
      if [ -n "${hpctrain_by_shell:-}" ] && ! hpctrain_budget_left; then
        echo "hpctrain: stopped and not requeued: $hpctrain_budget_why" >&2
        exit 3
      fi
      # the requeue ends every step: pyxis's containers go first (pyxis_clean.sh), the guard ends its own
      if [ -n "${hpctrain_pyxis_name:-}" ]; then hpctrain_pyxis_clean "" || true; fi
      hpctrain_guard_stop || true
      if hpctrain_requeue_excluding; then
        if [ -n "${hpctrain_bad// /}" ]; then
          hpctrain_new=$hpctrain_bad hpctrain_fault=$hpctrain_bad_why
          hpctrain_record requeue
        fi
        exit 0
      fi
      echo "hpctrain: scontrol requeue $hpctrain_job failed; the checkpoint is saved: resubmit the same job to resume" >&2
      exit 1 ;;
    end)
      echo "hpctrain: stopped and not requeued: $hpctrain_why" >&2
      # Slurm >= 24.05 would requeue a preempted job as this shell ends, whatever its exit status
      if hpctrain_preempted && hpctrain_slurm_requeues_preempted; then
        if hpctrain_scontrol update JobId="$hpctrain_job" Requeue=0 >/dev/null; then
          echo "hpctrain: job $hpctrain_job set to Requeue=0, so that Slurm does not requeue it after its preemption" >&2
        else
          echo "hpctrain: could not set job $hpctrain_job to Requeue=0: Slurm may requeue it; scancel $hpctrain_job ends it" >&2
        fi
      fi
      exit 3 ;;
  esac
  exit "$hpctrain_rc"
}
