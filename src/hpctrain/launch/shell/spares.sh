# shellcheck shell=bash disable=SC2034,SC2154  # a part of the batch script: the others set and read its variables
for hpctrain_v in "$hpctrain_spares" "$hpctrain_tpn" "${SLURM_JOB_NUM_NODES:-1}"; do  # before arithmetic
  case "$hpctrain_v" in
    ''|*[!0-9]*) echo "hpctrain: HPCTRAIN_SPARE_NODES ($hpctrain_spares), SLURM_NTASKS_PER_NODE\
 ($hpctrain_tpn) and SLURM_JOB_NUM_NODES (${SLURM_JOB_NUM_NODES:-}) must be whole numbers" >&2; exit 1 ;;
  esac
done
hpctrain_train_nodes=$(( ${SLURM_JOB_NUM_NODES:-1} - hpctrain_spares ))
if [ "$hpctrain_train_nodes" -lt 1 ]; then
  echo "hpctrain: $hpctrain_spares spare node(s) leave none of the job's ${SLURM_JOB_NUM_NODES:-1} to train on:" \
    "ask for more nodes or fewer spares (HPCTRAIN_SPARE_NODES)" >&2
  exit 1
fi
export HPCTRAIN_BAD_NODES_FILE="$HPCTRAIN_CONTROL_DIR/bad-nodes-${SLURM_JOB_ID:-none}"
# one line per in-job restart or exclusion, kept across requeues: rank 0 records them (metrics.jsonl)
export HPCTRAIN_FAULTS_FILE="$HPCTRAIN_CONTROL_DIR/faults-${SLURM_JOB_ID:-none}"
hpctrain_names() {  # only names a node may have (hpctrain.run.badnodes.NODE_NAME), one per line
  grep -xE "$hpctrain_node_name" || true
}
hpctrain_hosts() {  # a Slurm host list → node names, one per line
  { scontrol show hostnames "$1" 2>/dev/null || true; } | hpctrain_names  # (set -o pipefail)
}
hpctrain_alloc=" $(hpctrain_hosts "${SLURM_JOB_NODELIST:-}" | tr "\n" " ")"
hpctrain_bad=" " hpctrain_attempt=0 hpctrain_step=()
hpctrain_healthy() {  # the job's nodes now (a failed node leaves a --no-kill job), minus the excluded
  local n
  for n in $(hpctrain_hosts "$(hpctrain_job_field NodeList)"); do
    case "$hpctrain_bad" in *" $n "*) ;; *) echo "$n" ;; esac
  done
}
hpctrain_probe() {  # a short step on one node: does it still run a task?
  timeout "${HPCTRAIN_PROBE_S:-10}" srun --overlap --nodes=1 --ntasks=1 --nodelist="$1" true >/dev/null 2>&1 ||
    printf '%s\t%s\n' "$1" "no answer to a probe step (srun true, ${HPCTRAIN_PROBE_S:-10} s)"
}
hpctrain_faults() {  # 'node<TAB>why' for every node named faulty after the step
  local n why now st
  if [ -s "$HPCTRAIN_BAD_NODES_FILE" ]; then
    while IFS=$'\t' read -r n why; do printf '%s\t%s\n' "$n" "${why:-named by a task}"; done < "$HPCTRAIN_BAD_NODES_FILE"
  fi
  now=" $(hpctrain_hosts "$(hpctrain_job_field NodeList)" | tr "\n" " ")"
  for n in $hpctrain_step_hosts; do
    case "$now" in *" $n "*) ;; *) printf '%s\t%s\n' "$n" "left the job's allocation (Slurm: node failure)"; continue ;; esac
    st=$(scontrol show node -o "$n" 2>/dev/null | tr " " "\n" | sed -n "s/^State=//p")
    # NOT_RESPONDING alone is one missed RPC (a busy or restarting slurmd): the probe below decides
    case "$st" in *DOWN*|*DRAIN*|*FAIL*) printf '%s\t%s\n' "$n" "node state $st (scontrol show node)" ;; esac
  done
  if [ "$hpctrain_rc" != 0 ]; then
    for n in $now; do hpctrain_probe "$n" & done
    wait
  fi
}
hpctrain_name_faults() {  # hpctrain_new (node names) and hpctrain_fault (why), for this job's nodes only
  local n why seen=' '
  hpctrain_new="" hpctrain_fault=""
  # a job Slurm is ending or requeueing itself (NODE_FAIL without --no-kill, scancel): its own
  # decision; probes would fail on healthy nodes then
  [ "$(hpctrain_job_field JobState)" = RUNNING ] || return 0
  while IFS=$'\t' read -r n why; do
    case "$hpctrain_alloc" in *" $n "*) ;; *) continue ;; esac
    [ -n "$(printf '%s\n' "$n" | hpctrain_names)" ] || continue
    case "$seen" in *" $n "*) continue ;; esac
    seen="$seen$n " hpctrain_new="$hpctrain_new$n "
    hpctrain_fault="${hpctrain_fault:+$hpctrain_fault; }$n: $(printf '%s' "$why" | tr -d '\000-\037')"
  done <<< "$(hpctrain_faults)"
}
hpctrain_record() {  # a line of $HPCTRAIN_FAULTS_FILE: time, restart, attempt, action, nodes, why, step end
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date +%s)" "${SLURM_RESTART_COUNT:-0}" "$hpctrain_attempt" "$1" \
    "$(echo $hpctrain_new | tr " " ",")" "$hpctrain_fault" "$hpctrain_ended" >> "$HPCTRAIN_FAULTS_FILE" || true
}
# Requeue with the named nodes added to ExcNodeList, which Slurm takes on pending jobs only: right
# after the requeue (a requeued job may start only after cred_expire, 120 s by default; not held,
# which would leave the job held if this shell died before the release).
hpctrain_requeue_excluding() {
  local old new
  old=$(hpctrain_job_field ExcNodeList); [ "$old" != "(null)" ] || old=""
  new=$(echo $old $hpctrain_bad | tr " " ",")
  scontrol requeue "$hpctrain_job" || return 1
  if scontrol update job="$hpctrain_job" ExcNodeList="$new"; then
    hpctrain_new=$hpctrain_bad; hpctrain_record requeue
    echo "hpctrain: job $hpctrain_job requeued without $new"
  else echo "hpctrain: job $hpctrain_job requeued; $new could not be excluded: it may run there again" >&2
  fi
}
