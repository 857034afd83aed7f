# shellcheck shell=bash
# summary: the nodes this job leaves out after a fault, and the srun options that leave them out
# Nodes this job leaves out (docs/spares.md, "Which nodes are left out, and for how long"). A node goes
# in only with evidence of a fault: a task named it, its probe step failed, Slurm took it from the job
# or shows it DOWN or FAIL after a failed step (DRAIN alone is maintenance: Slurm schedules nothing new
# there anyway, and after a reboot it is back). Each exclusion is a line of $HPCTRAIN_EXCLUDED_FILE
# (time, node, why), kept across requeues; ExcNodeList, written at each requeue, holds the user's own
# exclusions and those lines that are younger than HPCTRAIN_EXCLUDE_S (default 21600 s, 6 h: a node
# repaired since is used again), newest first and no more than the job's partition can spare: a job
# of N nodes on a partition of P keeps at most P-N of them, so that it can always be scheduled.
hpctrain_exclude_add() {  # remember nodes ($1: names separated by spaces) left out for a fault ($2: why)
  local n now
  now=$(date +%s)
  for n in $1; do
    printf '%s\t%s\t%s\n' "$now" "$n" "$(printf '%s' "$2" | tr -d '\000-\037')" >> "$HPCTRAIN_EXCLUDED_FILE" || true
    hpctrain_report_node "$n" "$2" || true  # the site's admins (report_node.sh)
  done
}
hpctrain_exc_list() {  # the ExcNodeList to write now, from the job's current one ($1), comma-separated
  local n t cap total now ours=" " kept=" " out=()
  now=$(date +%s)
  if [ -s "$HPCTRAIN_EXCLUDED_FILE" ]; then
    while IFS=$'\t' read -r t n _; do ours="$ours$n "; done < "$HPCTRAIN_EXCLUDED_FILE"
  fi
  for n in $(hpctrain_hosts "$1"); do  # the user's own (sbatch --exclude): kept, and not counted
    case "$ours" in *" $n "*) ;; *) out+=("$n") ;; esac
  done
  total=$(hpctrain_scontrol show partition -o "${SLURM_JOB_PARTITION:-}" | tr " " "\n" | sed -n 's/^TotalNodes=//p' |
    head -n 1) || true
  cap=$(( ${total:-0} - ${SLURM_JOB_NUM_NODES:-1} ))
  [ -n "$total" ] || cap=1000000  # partition unknown: no cap
  if [ -s "$HPCTRAIN_EXCLUDED_FILE" ]; then
    while IFS=$'\t' read -r t n; do
      [ "$cap" -gt 0 ] || break
      case "$kept" in *" $n "*) continue ;; esac
      [ "$((now - t))" -lt "${HPCTRAIN_EXCLUDE_S:-21600}" ] || break  # older lines follow: expired too
      kept="$kept$n " out+=("$n") cap=$((cap - 1))
    done < <(cut -f1,2 "$HPCTRAIN_EXCLUDED_FILE" | grep -E "^[0-9]+"$'\t' | sort -rn -k1,1)
  fi
  (IFS=,; printf '%s\n' "${out[*]}")
}
# Requeue with the excluded nodes in ExcNodeList, which Slurm takes on pending jobs only: right
# after the requeue (a requeued job may start only after cred_expire, 120 s by default; not held,
# which would leave the job held if this shell died before the release).
hpctrain_requeue_excluding() {
  local old new
  old=$(hpctrain_job_field ExcNodeList); [ "$old" != "(null)" ] || old=""
  new=$(hpctrain_exc_list "$old")
  hpctrain_requeue || return
  if [ "$new" = "$old" ]; then
    [ -z "$new" ] || echo "hpctrain: job $hpctrain_job requeued; ExcNodeList stays $old"
  elif hpctrain_scontrol update job="$hpctrain_job" ExcNodeList="$new" >/dev/null; then
    echo "hpctrain: job $hpctrain_job requeued with ExcNodeList=${new:-(none)} (was ${old:-empty})"
  else echo "hpctrain: job $hpctrain_job requeued; ExcNodeList=$new could not be set: it may run there again" >&2
  fi
}
# hpctrain_setup_exclude: the file of the nodes left out
hpctrain_setup_exclude() {
  export HPCTRAIN_EXCLUDED_FILE="$HPCTRAIN_CONTROL_DIR/excluded-${SLURM_JOB_ID:-none}"
}
