# shellcheck shell=bash disable=SC2034,SC2154  # a part of the batch script: the others set and read its variables
# The batch host's death would leave a --no-kill job RUNNING without this shell: a guard on
# another node requeues it then (launch.inplace.guard_lines).
hpctrain_batch_host=$(printf "%s\n" "${SLURMD_NODENAME:-}" | hpctrain_names)
hpctrain_guard_node=$(for n in $hpctrain_alloc; do [ "$n" = "$hpctrain_batch_host" ] || echo "$n"; done | tail -n 1)
if [ "$hpctrain_spares" -gt 0 ] && [ -n "$hpctrain_batch_host" ] && [ -n "$hpctrain_guard_node" ]; then
  srun --overlap --nodes=1 --ntasks=1 --nodelist="$hpctrain_guard_node" bash -c '
    while sleep "${HPCTRAIN_GUARD_S:-10}"; do
      st=$(scontrol show node -o "$1" 2>/dev/null | tr " " "\n" | sed -n "s/^State=//p")
      case "$st" in *DOWN*|*NOT_RESPONDING*|*FAIL*) ;; *) continue ;; esac
      echo "hpctrain: the batch host $1 is $st: its shell is gone; requeueing job $2 without it" >&2
      old=$(scontrol show job -o "$2" | tr " " "\n" | sed -n "s/^ExcNodeList=//p")
      [ "$old" != "(null)" ] || old=""
      trap "" TERM  # the requeue TERMs this step too: finish the update first (KillWait)
      scontrol requeue "$2" || { scancel "$2"; exit 1; }
      scontrol update job="$2" ExcNodeList="${old:+$old,}$1"; exit 0
    done' hpctrain-guard "$hpctrain_batch_host" "$hpctrain_job" &
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
