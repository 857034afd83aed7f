# shellcheck shell=bash
# summary: the time limit's clock: re-read Slurm's EndTime and stop the tasks before it
# The time limit's clock (docs/launch.md, "Runs that last days"). The job's end is Slurm's EndTime now,
# not the one it had at the start: an admin's `scontrol update job=… TimeLimit=…` moves it, and so does
# a suspend (a resume adds the time the job was suspended; both measured on 22.05). A clock in the
# background re-reads it from slurmctld before it acts, at most every 300 s and again at each SIGCONT (a
# resume), and keeps the current end in $HPCTRAIN_END_FILE for the tasks (`<end, Unix s>`, and ` stop`
# once the stop is due), who stat it at step boundaries (train.stop). At the end less
# HPCTRAIN_SIGNAL_LEAD_S it asks the tasks to stop through that file and, unless Slurm's USR2 came (its
# mark, stops.sh), sends this shell the USR2 itself: a lost time-limit signal (22.05 has no
# SLURM_JOB_END_TIME for the tasks) still ends in a checkpoint and a requeue, not a TIMEOUT.
hpctrain_end_time() {  # the job's EndTime now, in Unix seconds (empty: unknown, or no time limit)
  local t
  t=$(hpctrain_job_field EndTime)
  case $t in ''|Unknown|None) return 0 ;; esac
  date -d "$t" +%s 2>/dev/null || true
}
hpctrain_end_write() {  # $1: the end; $2: "stop" once due. Rewritten only on a change (the tasks stat it)
  local line="$1${2:+ $2}" old=""
  [ ! -f "$HPCTRAIN_END_FILE" ] || read -r old < "$HPCTRAIN_END_FILE" || true
  [ "$line" != "$old" ] || return 0
  printf '%s\n' "$line" > "$HPCTRAIN_END_FILE.tmp" && mv -f "$HPCTRAIN_END_FILE.tmp" "$HPCTRAIN_END_FILE"
}
hpctrain_clock() {  # in the background until the stop is due
  local end now due nap
  trap '' USR2
  trap 'kill "$!" 2>/dev/null' CONT  # resumed: wake up and ask for the new end now
  trap 'kill "$!" 2>/dev/null; exit 0' TERM  # the exit hook: the nap goes too
  while :; do
    end=$(hpctrain_end_time)
    if [ -z "$end" ]; then sleep 600 & wait "$!" || true; continue; fi
    now=$(date +%s) due=$((end - ${HPCTRAIN_SIGNAL_LEAD_S:-180}))
    if [ "$now" -lt "$due" ]; then
      hpctrain_end_write "$end"
      nap=$((due - now)); [ "$nap" -le 300 ] || nap=300
      sleep "$nap" & wait "$!" || true  # a SIGCONT ends the wait early
      continue
    fi
    hpctrain_end_write "$end" stop
    if [ ! -e "$HPCTRAIN_CONTROL_DIR/usr2-${SLURM_JOB_ID:-none}" ]; then
      echo "hpctrain: the job's time limit is $((end - now)) s away ($(date -d "@$end" +%T)) and no USR2 came:" \
        "stopping as for it (the batch shell's own clock)" >&2
      kill -USR2 "$$"
    fi
    return 0
  done
}
hpctrain_clock_stop() { kill "$hpctrain_clock_pid" 2>/dev/null || true; }
# hpctrain_setup_clock: the end file, and the clock in the background
hpctrain_setup_clock() {
  export HPCTRAIN_END_FILE="$HPCTRAIN_CONTROL_DIR/end-${SLURM_JOB_ID:-none}"
  rm -f "$HPCTRAIN_END_FILE"
  hpctrain_clock &
  hpctrain_clock_pid=$!
  hpctrain_at_exit+=(hpctrain_clock_stop)
}
