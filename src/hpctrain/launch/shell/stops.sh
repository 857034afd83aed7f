# shellcheck shell=bash
# summary: stops: USR2/TERM to the tasks, the stop file, scontrol requeue from this shell (not the tasks)
# Stops. The tasks checkpoint at the next step on USR2 (--signal, before the time limit) and
# on SIGTERM (preemption); rank 0 then writes `requeue` or `end` (and why) to $HPCTRAIN_STOP_FILE
# and this shell, outside any container, runs `scontrol requeue`: the task's Python never needs
# a Slurm client. USR2 or TERM sent to this shell alone (--signal=B:USR2, scancel --batch) is
# passed to the tasks as USR2 (srun itself would turn a TERM into SIGKILL for them); a USR2 that
# announces a preemption (PreemptTime set: a site with preempt_send_user_signal) as SIGTERM, so
# that the tasks count it as one (slurm.max_preemptions), not as a time limit. `scancel --full`
# signals every step as well as this shell (scancel(1)): the tasks then get the signal itself too,
# and a TERM counts as a preemption; use --batch for a time-limit stop.
hpctrain_run_at_exit() { local h; for h in ${hpctrain_at_exit[@]+"${hpctrain_at_exit[@]}"}; do "$h" || true; done; }
hpctrain_preempted() {  # Slurm has picked this job for preemption (PreemptTime is set)
  # asked in the USR2 handler too: at most 5 s there (a controller that is away would hold scontrol for
  # ~9 s, and the stop's lead time is short); no answer reads as "not preempted" (a time limit)
  local t
  t=$(hpctrain_slurm -w 0 -t 5 scontrol show job -o "$hpctrain_job" | tr " " "\n" | sed -n "s/^PreemptTime=//p" |
    head -n 1)
  [ -n "$t" ] && [ "$t" != None ]
}
# This shell's own requeues (nodes it found faulty, the guard's) count against slurm.max_requeues as
# rank 0's do (run/requeue.py): the attempts that ended without a newer checkpoint (progress.sh), and
# were not preemptions. The preemptions are counted here, one line each, as this shell ends for one.
hpctrain_count_preemption() {
  echo "${SLURM_RESTART_COUNT:-0}" >> "$HPCTRAIN_CONTROL_DIR/preempted-${SLURM_JOB_ID:-none}" || true
}
hpctrain_budget_left() {  # 0 while the job may be requeued once more; else why not in hpctrain_budget_why
  local p=0 others now="" start what="for time limits or failures"
  # progress.sh: only attempts without progress count, once the run is known; 0 turns requeues off (--no-requeue)
  [ "${HPCTRAIN_MAX_REQUEUES:-3}" = 0 ] || ! declare -F hpctrain_ckpt_latest >/dev/null || now=$(hpctrain_ckpt_latest)
  if [ -n "$now" ]; then
    start=$(hpctrain_progress_start "${SLURM_RESTART_COUNT:-0}")
    [ -z "$start" ] || [ "$start" = "$now" ] || return 0  # this attempt checkpointed: nothing spent
    others=$(hpctrain_stalled "$now") what="without progress (no newer checkpoint)"
  else
    [ ! -s "$HPCTRAIN_CONTROL_DIR/preempted-${SLURM_JOB_ID:-none}" ] ||
      p=$(sort -u "$HPCTRAIN_CONTROL_DIR/preempted-${SLURM_JOB_ID:-none}" | wc -l)
    others=$(( ${SLURM_RESTART_COUNT:-0} - p ))
  fi
  [ "$others" -ge "${HPCTRAIN_MAX_REQUEUES:-3}" ] || return 0
  hpctrain_budget_why="job $hpctrain_job was requeued $others time(s) already $what\
 (slurm.max_requeues=${HPCTRAIN_MAX_REQUEUES:-3}): resubmit it to resume from the last checkpoint once its nodes are fixed"
  return 1
}
# Slurm >= 24.05 marks a job it signals at the start of its GraceTime (GRACE_PREEMPT,
# src/interfaces/preempt.c) and reads the mark when the batch shell ends (proc_req.c, job_mgr.c
# _job_complete): under preempt mode REQUEUE it requeues a --requeue job itself, even one whose shell
# ends it (exit 3); under any other mode (CANCEL) it records the end PREEMPTED. Only Slurm's own requeue
# clears the mark, not `scontrol requeue` (_job_requeue_op): after ours, the next run's end, even a
# finished one's, is requeued again (REQUEUE) or recorded PREEMPTED (CANCEL) (docs/slurm-versions.md).
hpctrain_marks_preempted() {  # this Slurm keeps such a mark (>= 24.05)
  local v major minor; v=$(scontrol --version 2>/dev/null) || return 1; v=${v##* }
  major=${v%%.*} minor=${v#*.}; minor=${minor%%.*}
  { [ "$major" -gt 24 ] || { [ "$major" = 24 ] && [ "$minor" -ge 5 ]; }; } 2>/dev/null
}
hpctrain_conf() {  # one value of `scontrol show config` (empty when unknown; never fails)
  { hpctrain_scontrol show config || true; } | sed -n "s/^$1 *= *//p" | head -n 1
}
# The preempt mode slurmctld applies to this job (its preempt plugins: preempt/partition_prio takes the
# partition's PreemptMode, preempt/qos the job QOS's; both fall back to the cluster's PreemptMode).
hpctrain_preempt_mode() {
  local mode="" qos
  case $(hpctrain_conf PreemptType) in
    preempt/qos)
      qos=$(hpctrain_job_field QOS)
      [ -z "$qos" ] ||
        mode=$({ hpctrain_slurm sacctmgr -n -P show qos "$qos" format=PreemptMode || true; } | sed -n '/^sacctmgr: /!{p;q;}') ;;
    preempt/partition_prio)
      mode=$({ hpctrain_scontrol show partition -o "${SLURM_JOB_PARTITION:-}" || true; } | tr " " "\n" |
        sed -n "s/^PreemptMode=//p" | head -n 1) ;;
  esac
  case $mode in ""|cluster) mode=$(hpctrain_conf PreemptMode) ;; esac
  printf '%s\n' "${mode:-OFF}"
}
hpctrain_slurm_requeues_preempted() {  # Slurm requeues this preempted job itself as this shell ends
  hpctrain_marks_preempted || return 1
  [ "$(hpctrain_job_field Requeue)" = 1 ] || return 1
  case $(hpctrain_preempt_mode) in *REQUEUE*) return 0 ;; esac
  return 1
}
hpctrain_pass() {
  hpctrain_signal=$1
  [ "$1" != USR2 ] || : > "$HPCTRAIN_CONTROL_DIR/usr2-${SLURM_JOB_ID:-none}" 2>/dev/null || true  # clock.sh
  if [ "$1" = USR2 ] && [ -n "$hpctrain_srun" ] && hpctrain_ours "$hpctrain_srun" && hpctrain_preempted; then
    echo "hpctrain: batch shell received SIGUSR2 at $(date +%T) for a preemption (PreemptTime set):" \
      "the tasks get SIGTERM and checkpoint at the next step" >&2
    hpctrain_slurm -1 -w 0 scancel --signal=TERM "$hpctrain_job" && return
  fi
  echo "hpctrain: batch shell received SIG$1 at $(date +%T): the tasks checkpoint at the next step" >&2
  # the step still running: an ended srun's PID may be another process's now (signals.sh)
  if [ -n "$hpctrain_srun" ] && hpctrain_ours "$hpctrain_srun"; then kill -USR2 "$hpctrain_srun" 2>/dev/null || true; fi
}
# hpctrain_setup_stops: the control directory, the EXIT hooks, this job's name, the stop traps
hpctrain_setup_stops() {
  export HPCTRAIN_CONTROL_DIR="$PWD/.hpctrain"
  export HPCTRAIN_STOP_FILE="$HPCTRAIN_CONTROL_DIR/stop-${SLURM_JOB_ID:-none}"
  mkdir -m 0755 "$HPCTRAIN_CONTROL_DIR" 2>/dev/null || [ -d "$HPCTRAIN_CONTROL_DIR" ] || {
    echo "hpctrain: cannot create $HPCTRAIN_CONTROL_DIR: run the job from a writable directory" >&2
    exit 1
  }
  # this shell writes (faults-, stop-, bad-nodes-) through whatever is at those paths: ours alone (run.owner)
  if [ -L "$HPCTRAIN_CONTROL_DIR" ] || [ ! -O "$HPCTRAIN_CONTROL_DIR" ] ||
    [ -n "$(find "$HPCTRAIN_CONTROL_DIR" -maxdepth 0 -perm /022)" ]; then
    echo "hpctrain: $HPCTRAIN_CONTROL_DIR can be changed by another user (owner uid" \
      "$(stat -c %u "$HPCTRAIN_CONTROL_DIR"), mode $(stat -c %a "$HPCTRAIN_CONTROL_DIR")): check what is in it," \
      "then chmod 755 it as its owner (or remove it) and resubmit" >&2
    exit 1
  fi
  rm -f "$HPCTRAIN_STOP_FILE" "$HPCTRAIN_CONTROL_DIR/usr2-${SLURM_JOB_ID:-none}"
  # What the other parts run as this shell ends, on every path (exit, `set -e`, a failed check): one
  # EXIT trap for them all (a second `trap … EXIT` would replace the first). A hook that fails is skipped.
  hpctrain_at_exit=()
  trap hpctrain_run_at_exit EXIT
  # This job for scontrol: an array element by <array>_<index>, since the element whose own id is the
  # array's id would otherwise name (and requeue) the whole array.
  hpctrain_job=${SLURM_JOB_ID:-none}
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then hpctrain_job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}; fi
  hpctrain_signal="" hpctrain_srun=""
  trap 'hpctrain_pass USR2' USR2
  trap 'hpctrain_pass TERM' TERM
}
