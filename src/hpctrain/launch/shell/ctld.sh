# shellcheck shell=bash disable=SC2034,SC2154  # a part of the batch script: the others set and read its variables
# The batch shell's calls to slurmctld (docs/spares.md, "When slurmctld hiccups"). A restart or
# fail-over leaves the controller unreachable for a while and Slurm's clients give up after
# ~MessageTimeout with "Unable to contact slurm controller" (9 s measured on 22.05 and 24.11); a
# controller that is alive but stalled (SIGSTOPped, swapping, a long lock) takes the connection and
# never answers: "Socket timed out on send/recv operation", and the request may still be carried out
# once it wakes. Read as "the job is gone", either would end or fail to requeue a healthy job: these
# calls retry for up to HPCTRAIN_CTLD_WAIT_S (default 600 s: SlurmctldTimeout's default 120 s and a slow
# start with many jobs). Other errors come back at once. None of these functions fails under `set -e`
# unless it says so: a caller reads an empty field as "unknown".
hpctrain_scontrol() {  # scontrol "$@", retried while the controller does not answer; output on stdout
  local out rc end=$((SECONDS + ${HPCTRAIN_CTLD_WAIT_S:-600})) said=""
  while true; do
    hpctrain_out -2 out scontrol "$@"; rc=$?  # signals.sh: a trapped signal acts at once
    case "$rc:$out" in
      0:*) break ;;
      *"Unable to contact slurm controller"*|*"Socket timed out on send/recv"*|*"Zero Bytes were transmitted"*|\
      *"backup controller in standby mode"*)
        [ "$SECONDS" -lt "$end" ] || break ;;
      *) break ;;
    esac
    if [ -z "$said" ]; then
      echo "hpctrain: slurmctld did not answer at $(date +%T) (scontrol $1 $2: $(printf '%s' "$out" | tail -n 1 |
        tr -d '\000-\037' | cut -c1-120)): retrying for up to ${HPCTRAIN_CTLD_WAIT_S:-600} s" >&2
      said=1
    fi
    hpctrain_fg sleep 2
  done
  [ -z "$said" ] || echo "hpctrain: slurmctld answered again at $(date +%T) (scontrol $1 $2: exit $rc)" >&2
  printf '%s\n' "$out"
  return "$rc"
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
hpctrain_node_states() {  # 'node<TAB>State' for a host list, in one call (rl_enable counts each call)
  { hpctrain_scontrol show node -o "$1" || true; } | sed -n 's/^NodeName=\([^ ]*\) .* State=\([^ ]*\) .*/\1\t\2/p'
}
# Requeue this job: 0 once Slurm has taken the requeue (also one that timed out here but was carried
# out: the job left RUNNING or its restart count moved on; a second `scontrol requeue` would then fail),
# 2 when Slurm refuses to requeue it (--no-requeue), 1 when the controller gave no answer in time.
hpctrain_requeue() {
  local out st n end=$((SECONDS + ${HPCTRAIN_CTLD_WAIT_S:-600}))
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
    hpctrain_fg sleep 5
  done
}
