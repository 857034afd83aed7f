# shellcheck shell=bash disable=SC2034,SC2154  # a part of the batch script: the others set and read its variables
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
    fi
    if [ -n "${hpctrain_by_shell:-}" ] && ! hpctrain_budget_left; then
      echo "hpctrain: stopped and not requeued: $hpctrain_budget_why" >&2
      exit 3
    fi
    # the requeue ends every step: pyxis's containers go first (pyxis_clean.sh)
    if [ -n "${hpctrain_pyxis_name:-}" ]; then hpctrain_pyxis_clean "" || true; fi
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
    exit 3 ;;
esac
exit "$hpctrain_rc"
