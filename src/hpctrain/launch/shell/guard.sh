# shellcheck shell=bash
# summary: with spares: a guard step on another node requeues the job if the batch host dies
# The batch host's death would leave a --no-kill job RUNNING without this shell: a guard on
# another node requeues it then (launch.inplace.guard_lines).
# It acts when the batch host's base state is DOWN (Slurm declared it dead after SlurmdTimeout), or
# when it is NOT_RESPONDING and this shell's heartbeat ($hpctrain_alive, a counter it rewrites every
# HPCTRAIN_GUARD_S) has not moved on two polls in a row. Not on one missed ping of a busy or
# restarting slurmd while the shell beats, nor on DRAIN, FAIL or POWER_DOWN (the running job completes
# first). It must act before DOWN where it can: measured on the test cluster, a step whose srun was on
# the dead node did not outlive it. Its cost to slurmctld (docs/spares.md, "The guard"): it reads the
# heartbeat every HPCTRAIN_GUARD_S (a file, no call) and asks Slurm for the node's state only while the
# heartbeat stands still, and otherwise once every HPCTRAIN_GUARD_ASK_S (default 60 s: a batch host DOWN
# while its shell still beats), one `sinfo -n` of that node (hpctrain_node_state): one call a minute in
# steady state, where a poll of every 10 s made six, each of the whole node table. It requeues through hpctrain_requeue (retried); it cancels the
# job only when Slurm refuses any requeue of it or its slurm.max_requeues is spent: then the job,
# without its batch shell, would hold its nodes until its time limit.
hpctrain_guard_stop() {  # end the guard's step (srun passes USR1 on to it), for up to 10 s; before a requeue too
  local i
  [ -n "$hpctrain_guard_srun" ] || return 0
  kill -USR1 "$hpctrain_guard_srun" 2>/dev/null || true
  for i in $(seq 50); do kill -0 "$hpctrain_guard_srun" 2>/dev/null || break; sleep 0.2; done
  hpctrain_guard_srun=""
}
hpctrain_guard() {  # on the guard node: $1 the batch host
  local st rc beat last="" still=0 polls=0 every
  every=6  # polls per question to Slurm while the shell beats: HPCTRAIN_GUARD_ASK_S / HPCTRAIN_GUARD_S
  case "${HPCTRAIN_GUARD_S:-10}:${HPCTRAIN_GUARD_ASK_S:-60}" in
    *[!0-9:]*|0*) ;;
    *) every=$(( ${HPCTRAIN_GUARD_ASK_S:-60} / ${HPCTRAIN_GUARD_S:-10} )); [ "$every" -ge 1 ] || every=1 ;;
  esac
  # the batch shell's end (hpctrain_guard_stop): a step that ends 0, COMPLETED in sacct, not one that
  # the end of the job kills (CANCELLED); the sleep runs in the background so that USR1 acts at once
  trap 'kill "$!" 2>/dev/null; exit 0' USR1
  while sleep "${HPCTRAIN_GUARD_S:-10}" & wait "$!"; do
    beat=$(cat "$hpctrain_alive" 2>/dev/null) || beat=""
    if [ "$beat" = "$last" ]; then still=$((still + 1)); else still=0 last=$beat; fi
    polls=$((polls + 1))
    [ "$still" -gt 0 ] || [ $((polls % every)) = 0 ] || continue  # the shell beats: Slurm is asked now and then
    st=$(hpctrain_node_state "$1")
    case "${st%%+*}:+$st+:$still" in
      DOWN:*) ;;
      *+NOT_RESPONDING+*:[2-9]|*+NOT_RESPONDING+*:[1-9][0-9]*) ;;
      *) continue ;;
    esac
    echo "hpctrain: the batch host $1 is $st and its shell's heartbeat stopped $still poll(s) ago:" \
      "requeueing job $hpctrain_job without it" >&2
    trap "" TERM  # the requeue TERMs this step too: finish the update first (KillWait)
    hpctrain_exclude_add "$1" "batch host $1 $st (seen by the guard on $(hostname))"
    if ! hpctrain_budget_left; then
      echo "hpctrain: not requeued: $hpctrain_budget_why; cancelling it" >&2
      hpctrain_slurm scancel "$hpctrain_job"; exit 1
    fi
    hpctrain_requeue_excluding; rc=$?
    [ "$rc" != 2 ] || hpctrain_slurm scancel "$hpctrain_job"  # Slurm will not requeue it (1: no answer; left as it is)
    exit "$rc"
  done
}
# hpctrain_setup_guard: with spares: the guard step, and one step that runs the spares' Prolog
hpctrain_setup_guard() {
  local batch_host guard_node warm n
  batch_host=$(printf "%s\n" "${SLURMD_NODENAME:-}" | hpctrain_names)
  guard_node=$(for n in $hpctrain_alloc; do [ "$n" = "$batch_host" ] || echo "$n"; done | tail -n 1)
  hpctrain_guard_srun=""
  if [ "$hpctrain_no_kill" = 1 ] && [ -n "$batch_host" ] && [ -n "$guard_node" ]; then
    # its words go straight to the job's error file, appended by its own bash on the guard's node: once the
    # batch host is dead, no srun is left to carry them (a path with a % pattern: the run's .hpctrain/)
    hpctrain_alive="$HPCTRAIN_CONTROL_DIR/alive-${SLURM_JOB_ID:-none}"
    # (its sleep in the background: the TERM that ends it at exit ends the sleep too)
    (trap "" USR2; s="" i=0; trap '[ -z "$s" ] || kill "$s" 2>/dev/null; exit 0' TERM
     while :; do i=$((i + 1)); echo "$i" > "$hpctrain_alive" || true; sleep "${HPCTRAIN_GUARD_S:-10}" & s=$!; wait "$s"; done) &
    hpctrain_bg_add "$!"
    hpctrain_field hpctrain_guard_log StdErr
    case "$hpctrain_guard_log" in ''|*%*) hpctrain_guard_log="$HPCTRAIN_CONTROL_DIR/guard-${SLURM_JOB_ID:-none}.log" ;; esac
    hpctrain_slurm -b srun --overlap --nodes=1 --ntasks=1 --nodelist="$guard_node" --job-name=hpctrain-guard bash -c "$(declare -p hpctrain_job \
      hpctrain_node_name hpctrain_guard_log hpctrain_alive hpctrain_report_cmd hpctrain_report_file hpctrain_report_s \
      hpctrain_progress_file; declare -f hpctrain_guard hpctrain_now hpctrain_slurm_log hpctrain_slurm_transient \
      hpctrain_slurm_pause hpctrain_slurm hpctrain_scontrol hpctrain_job_field \
      hpctrain_names hpctrain_hosts hpctrain_node_state hpctrain_requeue hpctrain_exc_list hpctrain_requeue_excluding \
      hpctrain_exclude_add hpctrain_budget_left hpctrain_ours hpctrain_wait hpctrain_fg hpctrain_out \
      hpctrain_report_node hpctrain_ckpt_latest hpctrain_progress_start hpctrain_stalled); exec 2>>\"\$hpctrain_guard_log\"; hpctrain_guard \"\$1\"" \
      hpctrain-guard "$batch_host"
    hpctrain_guard_srun=$!
    hpctrain_at_exit+=(hpctrain_guard_stop)
  fi
  # A site's Prolog runs on a node when the job's first step starts there (slurm.conf Prolog, unless
  # PrologFlags=Alloc), and that step waits for it: a spare that never ran a step would spend its
  # Prolog inside its first probe step, after a failure, while the job waits (HPCTRAIN_PROBE_START_S).
  # One step on the spares now, beside the training's first step, runs their Prolog at the start.
  if [ "$hpctrain_spares" -gt 0 ]; then
    hpctrain_out warm hpctrain_healthy  # a trapped signal acts at once (signals.sh)
    warm=$(printf '%s\n' "$warm" | tail -n "+$((hpctrain_train_nodes + 1))")
    if [ -n "$warm" ]; then
      n=$(printf '%s\n' "$warm" | wc -l)
      warm=$(printf '%s\n' "$warm" | paste -sd, -)
      hpctrain_slurm -b srun --overlap --nodes="$n" --ntasks="$n" --nodelist="$warm" true >/dev/null 2>&1
      hpctrain_bg_add "$!"
    fi
  fi
}
