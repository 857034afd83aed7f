# shellcheck shell=bash disable=SC2034,SC2154  # a part of the batch script: the others set and read its variables
# The batch host's death would leave a --no-kill job RUNNING without this shell: a guard on
# another node requeues it then (launch.inplace.guard_lines).
hpctrain_batch_host=$(printf "%s\n" "${SLURMD_NODENAME:-}" | hpctrain_names)
hpctrain_guard_node=$(for n in $hpctrain_alloc; do [ "$n" = "$hpctrain_batch_host" ] || echo "$n"; done | tail -n 1)
# It acts on Slurm's base state DOWN (the node missed SlurmdTimeout), or NOT_RESPONDING seen on
# HPCTRAIN_GUARD_POLLS (6) polls in a row: one missed RPC (a slurmd restart, a busy slurmd) is not a
# death, nor are DRAIN, FAIL or POWER_DOWN (the running job completes first). It requeues through
# hpctrain_requeue (retried; never scancel, unless Slurm refuses any requeue of the job or its
# slurm.max_requeues is spent: then the job, without its batch shell, would hold its nodes until its
# time limit).
hpctrain_guard() {  # on the guard node: $1 the batch host
  local st rc quiet=0
  while sleep "${HPCTRAIN_GUARD_S:-10}"; do
    st=$(hpctrain_node_states "$1" | cut -f2)
    case "+$st+" in *+NOT_RESPONDING+*) quiet=$((quiet + 1)) ;; *) quiet=0 ;; esac
    [ "${st%%+*}" = DOWN ] || [ "$quiet" -ge "${HPCTRAIN_GUARD_POLLS:-6}" ] || continue
    echo "hpctrain: the batch host $1 is $st: its shell is gone; requeueing job $hpctrain_job without it" >&2
    trap "" TERM  # the requeue TERMs this step too: finish the update first (KillWait)
    hpctrain_exclude_add "$1" "batch host $1 $st (seen by the guard on $(hostname))"
    if ! hpctrain_budget_left; then
      echo "hpctrain: not requeued: $hpctrain_budget_why; cancelling it" >&2
      scancel "$hpctrain_job"; exit 1
    fi
    hpctrain_requeue_excluding; rc=$?
    [ "$rc" != 2 ] || scancel "$hpctrain_job"  # Slurm will not requeue it (1: no answer; left as it is)
    exit "$rc"
  done
}
if [ "$hpctrain_spares" -gt 0 ] && [ -n "$hpctrain_batch_host" ] && [ -n "$hpctrain_guard_node" ]; then
  srun --overlap --nodes=1 --ntasks=1 --nodelist="$hpctrain_guard_node" bash -c "$(declare -p hpctrain_job \
    hpctrain_node_name; declare -f hpctrain_guard hpctrain_scontrol hpctrain_job_field hpctrain_names hpctrain_hosts \
    hpctrain_node_states hpctrain_requeue hpctrain_exc_list hpctrain_requeue_excluding hpctrain_exclude_add \
    hpctrain_budget_left); hpctrain_guard \"\$1\"" hpctrain-guard "$hpctrain_batch_host" &
fi
# A site's Prolog runs on a node when the job's first step starts there (slurm.conf Prolog, unless
# PrologFlags=Alloc), and that step waits for it: a spare that never ran a step would spend its
# Prolog inside its first probe step and fail the probe's HPCTRAIN_PROBE_S (10 s) as "no answer".
# One step on the spares now, beside the training's first step, runs their Prolog at the start.
if [ "$hpctrain_spares" -gt 0 ]; then
  hpctrain_warm=$(hpctrain_healthy | tail -n "+$((hpctrain_train_nodes + 1))")
  if [ -n "$hpctrain_warm" ]; then
    hpctrain_n=$(printf '%s\n' "$hpctrain_warm" | wc -l)
    hpctrain_warm=$(printf '%s\n' "$hpctrain_warm" | paste -sd, -)
    srun --overlap --nodes="$hpctrain_n" --ntasks="$hpctrain_n" --nodelist="$hpctrain_warm" true >/dev/null 2>&1 &
  fi
fi
