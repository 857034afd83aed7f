# shellcheck shell=bash disable=SC2034  # a part of the batch script: the others read its variables
# Stops. The tasks checkpoint at the next step on USR2 (--signal, before the time limit) and
# on SIGTERM (preemption); rank 0 then writes `requeue` or `end` (and why) to $HPCTRAIN_STOP_FILE
# and this shell, outside any container, runs `scontrol requeue`: the task's Python never needs
# a Slurm client. USR2 or TERM sent to this shell (--signal=B:USR2, scancel --batch/--full) is
# passed to the tasks as USR2 (srun itself would turn a TERM into SIGKILL for them); a USR2 that
# announces a preemption (PreemptTime set: a site with preempt_send_user_signal) as SIGTERM, so
# that the tasks count it as one (slurm.max_preemptions), not as a time limit.
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
rm -f "$HPCTRAIN_STOP_FILE"
# This job for scontrol: an array element by <array>_<index>, since the element whose own id is the
# array's id would otherwise name (and requeue) the whole array.
hpctrain_job=${SLURM_JOB_ID:-none}
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then hpctrain_job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}; fi
hpctrain_signal="" hpctrain_srun=""
# A slurmctld restart (an upgrade, a failover) leaves the controller unreachable for a while: Slurm's
# clients give up after ~MessageTimeout with "Unable to contact slurm controller" (9 s measured on
# 22.05 and 24.11). Read as "the job is gone", that would end or fail to requeue a healthy job: this
# shell's controller calls retry for up to HPCTRAIN_CTLD_WAIT_S (default 600 s, SlurmctldTimeout's
# default 120 s and a slow start with many jobs). Other errors come back at once.
hpctrain_scontrol() {  # scontrol "$@", retried while the controller cannot be reached; output on stdout
  local out rc end=$((SECONDS + ${HPCTRAIN_CTLD_WAIT_S:-600})) said=""
  while true; do
    out=$(scontrol "$@" 2>&1); rc=$?
    case "$rc:$out" in
      0:*) break ;;
      *"Unable to contact slurm controller"*) [ "$SECONDS" -lt "$end" ] || break ;;
      *) break ;;
    esac
    if [ -z "$said" ]; then
      echo "hpctrain: slurmctld unreachable at $(date +%T) (scontrol $1 $2): retrying" \
        "for up to ${HPCTRAIN_CTLD_WAIT_S:-600} s" >&2
      said=1
    fi
    sleep 2
  done
  [ -z "$said" ] || echo "hpctrain: slurmctld answered again at $(date +%T) (scontrol $1 $2: exit $rc)" >&2
  printf '%s\n' "$out"
  return "$rc"
}
hpctrain_job_field() {  # one field of `scontrol show job` (empty when unknown)
  hpctrain_scontrol show job -o "$hpctrain_job" | tr " " "\n" | sed -n "s/^$1=//p" | head -n 1
}
hpctrain_preempted() {  # Slurm has picked this job for preemption (PreemptTime is set)
  # asked in the USR2 handler too: at most 5 s there (a controller that is away would hold scontrol for
  # ~9 s, and the stop's lead time is short); no answer reads as "not preempted" (a time limit)
  local t
  t=$(timeout 5 scontrol show job -o "$hpctrain_job" 2>/dev/null | tr " " "\n" | sed -n "s/^PreemptTime=//p" |
    head -n 1)
  [ -n "$t" ] && [ "$t" != None ]
}
# Slurm >= 24.05 requeues a preempted --requeue job itself when its batch shell ends inside the
# GraceTime under PreemptMode=REQUEUE; a `scontrol requeue` of ours then would leave Slurm's
# preemption mark on the job, and its next run, even a finished one, would be requeued again
# (PREEMPTED): leave that requeue to Slurm (docs/slurm-versions.md).
hpctrain_slurm_requeues_preempted() {
  local v major minor; v=$(scontrol --version 2>/dev/null) || return 1; v=${v##* }
  major=${v%%.*} minor=${v#*.}; minor=${minor%%.*}
  { [ "$major" -gt 24 ] || { [ "$major" = 24 ] && [ "$minor" -ge 5 ]; }; } 2>/dev/null || return 1
  [ "$(hpctrain_job_field Requeue)" = 1 ] || return 1
  scontrol show partition -o "${SLURM_JOB_PARTITION:-}" 2>/dev/null | tr " " "\n" |
    grep -q "^PreemptMode=.*REQUEUE"
}
hpctrain_pass() {
  hpctrain_signal=$1
  if [ "$1" = USR2 ] && [ -n "$hpctrain_srun" ] && hpctrain_preempted; then
    echo "hpctrain: batch shell received SIGUSR2 at $(date +%T) for a preemption (PreemptTime set):" \
      "the tasks get SIGTERM and checkpoint at the next step" >&2
    scancel --signal=TERM "$hpctrain_job" && return
  fi
  echo "hpctrain: batch shell received SIG$1 at $(date +%T): the tasks checkpoint at the next step" >&2
  if [ -n "$hpctrain_srun" ]; then kill -USR2 "$hpctrain_srun" 2>/dev/null || true; fi
}
trap 'hpctrain_pass USR2' USR2
trap 'hpctrain_pass TERM' TERM
