# shellcheck shell=bash
# summary: the batch shell's questions to Slurm through hpctrain_slurm (slurm_call.sh): job fields, node states, requeue
hpctrain_scontrol() {  # scontrol "$@" through hpctrain_slurm; output on stdout
  hpctrain_slurm scontrol "$@"
}
hpctrain_job_field() {  # one field of `scontrol show job` (empty when unknown; never fails)
  local out
  out=$(hpctrain_scontrol show job -o "$hpctrain_job") || true
  # the job's name is the user's and may hold " Key=value": cut it out before reading any field
  [ -z "${SLURM_JOB_NAME:-}" ] || out=${out/" JobName=$SLURM_JOB_NAME "/ }
  printf '%s\n' "$out" | tr " " "\n" | sed -n "s/^$1=//p" | head -n 1 || true
}
hpctrain_field() {  # $1= hpctrain_job_field $2, for this shell itself: a trapped signal acts at once (signals.sh)
  hpctrain_out "$1" hpctrain_job_field "$2" || true
}
hpctrain_names() {  # only names a node may have (hpctrain.run.badnodes.NODE_NAME), one per line
  grep -xE "$hpctrain_node_name" || true
}
hpctrain_hosts() {  # a Slurm host list → node names, one per line (none for an empty list: scontrol
  [ -n "$1" ] || return 0  # would read $SLURM_JOB_NODELIST then)
  { scontrol show hostnames "$1" 2>/dev/null || true; } | hpctrain_names  # (set -o pipefail)
}
hpctrain_commas() {  # ' n1 n2 ' → 'n1,n2', without word splitting (no name globs against $PWD)
  local l
  l=$(printf '%s' "$1" | tr -s ' ' ',')
  l=${l#,}
  printf '%s\n' "${l%,}"
}
# One node's state as scontrol writes it (BASE, +NOT_RESPONDING), from `sinfo -h -N -n NODE -o %T`: slurmctld
# sends that node's record alone (REQUEST_NODE_INFO_SINGLE), where `scontrol show node NODE` has it send
# every node's (REQUEST_NODE_INFO), measured with sdiag on 22.05.8; sinfo's `*` suffix is NOT_RESPONDING
# ("mixed*" for MIXED+NOT_RESPONDING, "down*" for DOWN+NOT_RESPONDING, measured); one line per partition.
hpctrain_node_state() {
  local s
  s=$({ hpctrain_slurm sinfo -h -N -n "$1" -o %T || true; } | grep -m 1 -xE '[a-z_]+[*~#!%$@^-]*' || true)
  [ -n "$s" ] || return 0
  case "$s" in *"*"*) printf '%s+NOT_RESPONDING\n' "${s%%[*~#!%\$@^-]*}" ;; *) printf '%s\n' "${s%%[*~#!%\$@^-]*}" ;; esac |
    tr '[:lower:]' '[:upper:]'
}
hpctrain_node_states() {  # 'node<TAB>State' for a host list, in one call (rl_enable counts each call)
  { hpctrain_scontrol show node -o "$1" || true; } | sed -n 's/^NodeName=\([^ ]*\) .* State=\([^ ]*\) .*/\1\t\2/p'
}
# Requeue this job: 0 once Slurm has taken the requeue (also one that timed out here but was carried
# out: the job left RUNNING or its restart count moved on; a second `scontrol requeue` would then fail),
# 2 when Slurm refuses to requeue it (--no-requeue), 1 when the controller gave no answer in time.
hpctrain_requeue() {
  local out st n try=0 end=$((SECONDS + ${HPCTRAIN_CTLD_WAIT_S:-600}))
  while true; do
    out=$(hpctrain_scontrol requeue "$hpctrain_job") && return 0
    st=$(hpctrain_job_field JobState)
    n=$(hpctrain_job_field Restarts)
    if [ -n "$st" ] && { [ "$st" != RUNNING ] || [ "${n:-0}" != "${SLURM_RESTART_COUNT:-0}" ]; }; then
      echo "hpctrain: job $hpctrain_job is $st (restart ${n:-?}) after 'scontrol requeue' answered: $out" >&2
      return 0
    fi
    case "$out" in *"presently disabled"*|*"not requeue"*|*"Requeue not allowed"*)
      echo "hpctrain: Slurm will not requeue job $hpctrain_job: $out" >&2; return 2 ;;
    esac
    [ "$SECONDS" -lt "$end" ] || return 1
    echo "hpctrain: scontrol requeue $hpctrain_job failed ($out): asking again" >&2
    hpctrain_slurm_pause "$try" $(( (end - SECONDS) * 1000 )); try=$((try + 1))
  done
}
