# shellcheck shell=bash
# summary: hpctrain_slurm: every call to slurmctld/slurmdbd (scontrol, squeue, sacct, srun...) logged, retried through a restart
# The batch shell's calls to slurmctld and slurmdbd: every one goes through hpctrain_slurm (docs/spares.md,
# "When slurmctld hiccups"; docs/sites.md, "What hpctrain costs your cluster"): scontrol, squeue, sinfo,
# sacct, sacctmgr, scancel, and srun, whose steps slurmctld creates. Not `scontrol show hostnames` nor
# `scontrol --version`, which scontrol answers itself. A restart or fail-over leaves the controller
# unreachable for a while and Slurm's clients give up after ~MessageTimeout with "Unable to contact
# slurm controller" (9 s measured on 22.05 and 24.11); a controller that is alive but stalled
# (SIGSTOPped, swapping, a long lock) takes the connection and never answers: "Socket timed out on
# send/recv operation", and the request may still be carried out once it wakes. Read as "the job is
# gone", either would end or fail to requeue a healthy job: such a call is asked again for up to
# HPCTRAIN_CTLD_WAIT_S (default 600 s: SlurmctldTimeout's default 120 s and a slow start with many
# jobs), after a pause that doubles from 1-2 s to 30-60 s, each drawn at random in its upper half:
# every job of a cluster retries after the same restart, and they must not come back in step. Other
# errors come back at once. None of these functions fails under `set -e` unless it says so: a caller
# reads an empty field as "unknown".
hpctrain_now() {  # $1= the time now, Unix seconds with microseconds (bash < 5 has no EPOCHREALTIME)
  if [ -n "${EPOCHREALTIME:-}" ]; then printf -v "$1" '%s' "${EPOCHREALTIME/,/.}"; else printf -v "$1" '%s' "$(date +%s.%6N)"; fi
}
# With HPCTRAIN_SLURM_CALL_LOG set (an absolute path), each call is one JSON line appended to that file,
# as the login node's client writes them (site/slurm_cli.py): {"t": start, "kind": "scontrol", "args":
# [...], "s": seconds, "rc": exit status (null: a step started in the background), "where": "batch",
# "cached": false}. One printf of one line under 4 KiB (each argument cut at 100 characters, 30 of
# them and ~3000 characters at most, then "...") to a file opened O_APPEND: lines of concurrent
# writers do not interleave.
hpctrain_slurm_log() {  # $1 the call's start (hpctrain_now), $2 its exit status ('': not waited for), $3… its argv
  [ -n "${HPCTRAIN_SLURM_CALL_LOG:-}" ] || return 0
  local t0=$1 rc=${2:-null} t1 us a args="" n=0
  shift 2
  hpctrain_now t1
  us=$(( ${t1/./} - ${t0/./} ))
  for a in "${@:2}"; do
    n=$((n + 1))
    if [ "$n" -gt 30 ] || [ "${#args}" -gt 3000 ]; then args+=', "..."'; break; fi
    a=${a:0:100} a=${a//\\/\\\\} a=${a//\"/\\\"} a=${a//$'\n'/\\n} a=${a//$'\t'/\\t} a=${a//$'\r'/\\r}
    args+="${args:+, }\"${a//[[:cntrl:]]/}\""
  done
  printf '{"t": %s, "kind": "%s", "args": [%s], "s": %d.%06d, "rc": %s, "where": "batch", "cached": false}\n' \
    "$t0" "${1##*/}" "$args" $((us / 1000000)) $((us % 1000000)) "$rc" >> "$HPCTRAIN_SLURM_CALL_LOG" 2>/dev/null || true
}
hpctrain_slurm_transient() {  # $1 the command, $2 its output: the controller did not answer (worth asking again)
  case "$2" in
    *"Unable to contact slurm controller"*|*"Socket timed out on send/recv"*|*"Zero Bytes were transmitted"*|\
    *"backup controller in standby mode"*) return 0 ;;
    # measured (24.11.5): for ~5 s after slurmctld restarts, srun fails "Unable to create step … Memory
    # required by task is not available" (the nodes have not registered again)
    *"Memory required by task is not available"*) [ "${1##*/}" = srun ] ;;
    *) return 1 ;;
  esac
}
hpctrain_slurm_pause() {  # $1 the retry (0, 1, …), $2 ms left: sleep the backoff; hpctrain_slurm_slept += it (ms)
  local c=$(( 2 << ($1 < 5 ? $1 : 5) )) ms
  [ "$c" -le 60 ] || c=60  # 2, 4, 8, 16, 32, then 60 s: a pause in c/2 … c
  ms=$(( c * 500 + c * (((RANDOM << 15 | RANDOM) ^ BASHPID) % 1000) / 2 ))
  [ "$ms" -le "$2" ] || ms=$2
  [ "$ms" -ge 1000 ] || ms=1000
  hpctrain_fg sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
  hpctrain_slurm_slept=$((hpctrain_slurm_slept + ms))
}
# hpctrain_slurm [-b | -1] [-w S] [-t S] CMD ARG…: CMD's output, its stderr too, on stdout once it ends,
# and its exit status; asked again while the controller does not answer, for up to S s (-w; default
# HPCTRAIN_CTLD_WAIT_S, 0: once). -t S: each try bounded by `timeout S` (exit 124). -1: once, its output
# as it comes (a step whose lines go to the job's log). -b: started in the background, a child of this
# shell ($! is its PID: srun passes this shell's signals on to the step), logged as it starts.
hpctrain_slurm() {
  local mode="" wait_s=${HPCTRAIN_CTLD_WAIT_S:-600} limit=() out rc t0="" try=0 left said="" start=$SECONDS
  hpctrain_slurm_slept=0
  while :; do
    case "$1" in
      -b|-1) mode=$1; shift ;;
      -w) wait_s=$2; shift 2 ;;
      -t) limit=(timeout "$2"); shift 2 ;;
      *) break ;;
    esac
  done
  [ -z "${HPCTRAIN_SLURM_CALL_LOG:-}" ] || hpctrain_now t0
  if [ "$mode" = -b ]; then
    "$@" &
    hpctrain_slurm_log "$t0" "" "$@"
    return 0
  fi
  if [ "$mode" = -1 ]; then
    ${limit[@]+"${limit[@]}"} "$@"; rc=$?
    hpctrain_slurm_log "$t0" "$rc" "$@"
    return "$rc"
  fi
  while :; do
    hpctrain_out -2 out ${limit[@]+"${limit[@]}"} "$@"; rc=$?  # signals.sh: a trapped signal acts at once
    hpctrain_slurm_log "$t0" "$rc" "$@"
    [ "$rc" != 0 ] && hpctrain_slurm_transient "$1" "$out" || break
    # the time spent so far: the clock's, or the pauses' where sleep took less (never below them)
    left=$(( wait_s * 1000 - hpctrain_slurm_slept )); [ "$left" -le $(( (wait_s - SECONDS + start) * 1000 )) ] ||
      left=$(( (wait_s - SECONDS + start) * 1000 ))
    [ "$left" -gt 0 ] || break
    if [ -z "$said" ]; then
      echo "hpctrain: slurmctld did not answer at $(date +%T) (${1##*/} $2 $3: $(printf '%s' "$out" | tail -n 1 |
        tr -d '\000-\037' | cut -c1-120)): asking again, at pauses growing to 30-60 s, for up to $wait_s s" >&2
      said=1
    fi
    hpctrain_slurm_pause "$try" "$left"; try=$((try + 1))
    [ -z "${HPCTRAIN_SLURM_CALL_LOG:-}" ] || hpctrain_now t0
  done
  [ -z "$said" ] || echo "hpctrain: slurmctld answered again at $(date +%T) (${1##*/} $2 $3: exit $rc)" >&2
  printf '%s\n' "$out"
  return "$rc"
}
