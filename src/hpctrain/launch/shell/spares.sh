# shellcheck shell=bash
# summary: hot spares: the nodes the step runs on and those held idle until a node fails
hpctrain_healthy() {  # the job's nodes now (a failed node leaves a --no-kill job), minus the excluded
  local n
  for n in $(hpctrain_hosts "$(hpctrain_job_field NodeList)"); do
    case "$hpctrain_bad" in *" $n "*) ;; *) echo "$n" ;; esac
  done
}
# A probe checks, on each node, outside the container, what a task needs: that a task starts; that
# the GPUs the job uses are listed (nvidia-smi -L, where there is one and the job asked for GPUs: a GPU
# lost to an Xid or ECC error drops out of the list; no answer in HPCTRAIN_PROBE_S is a fault too); that
# the run directory's control folder takes a write within 5 s (exit 3: a stalled file system, which is
# no node's fault). All the nodes are probed by ONE step of one task per node (slurmctld creates one
# step, not one per node: under a big allocation and a site's rl_enable, a step per node made 2 × N
# calls at once). Each task prints lines that name its node: `hpctrain-probe NODE started` first (a
# task that has not started yet is waiting for its node: a site's Prolog runs inside a node's first
# step of the job, unless PrologFlags=Alloc, which is given HPCTRAIN_PROBE_START_S, not the checks' few
# seconds), then `hpctrain-probe NODE EXIT WHY`, and ends 0 (a site's KillOnBadExit would otherwise end
# the other nodes' checks).
# shellcheck disable=SC2016  # expanded by the probe step's own bash, from its arguments
hpctrain_probe_check='
h=${SLURMD_NODENAME:-$(hostname)}
echo "hpctrain-probe $h started"
why=$(
  if [ "${1:-0}" -gt 0 ] 2>/dev/null && command -v nvidia-smi >/dev/null 2>&1; then
    l=$(timeout "$3" nvidia-smi -L 2>/dev/null)
    [ "$?" != 124 ] || { echo "nvidia-smi -L gave no answer in $3 s"; exit 4; }
    n=$(printf "%s\n" "$l" | grep -c "^GPU ")
    [ "$n" -ge "$1" ] || { echo "nvidia-smi -L lists $n of the $1 GPU(s) the job uses"; exit 2; }
  fi
  timeout 5 touch "$2/probe-$h" 2>/dev/null || { echo "the run directory took no write in 5 s"; exit 3; }
); rc=$?
echo "hpctrain-probe $h $rc $(printf "%s" "$why" | tr -d "\000-\037" | cut -c1-200)"'
# A step the controller refuses before it asks any node is no node's fault: measured (24.11.5), while
# slurmctld restarts srun fails with "Unable to confirm allocation … Unable to contact slurm
# controller", and for ~5 s after it with "Unable to create step … Memory required by task is not
# available" (the nodes have not registered again). Such a probe is asked again (hpctrain_slurm), for
# up to 60 s. A node without a verdict line: one srun names ("Task launch … failed on node N", "N: …")
# is at fault; after HPCTRAIN_PROBE_START_S, one whose task started did not end its checks, one whose
# task did not start waits for its node; the others, when srun gave up on another node, are not
# blamed (their task was ended with the step); no node answered and srun named none: each is named.
hpctrain_probe() {  # nodes… → 'node<TAB>why' for each that fails its probe ('fs: why' for the file system)
  local out rc n tag r why err any="" named="" nodes
  local -A verdict=() started=()
  [ "$#" -gt 0 ] || return 0
  nodes=$(IFS=,; printf '%s' "$*")
  out=$(hpctrain_slurm -w 60 -t "$hpctrain_probe_start_s" srun --overlap --nodes="$#" --ntasks="$#" --ntasks-per-node=1 \
    --nodelist="$nodes" --kill-on-bad-exit=0 ${hpctrain_probe_gpus[@]+"${hpctrain_probe_gpus[@]}"} \
    bash -c "$hpctrain_probe_check" hpctrain-probe "${hpctrain_gpus:-0}" "$HPCTRAIN_CONTROL_DIR" "$hpctrain_probe_s"); rc=$?
  while read -r tag n r why; do
    [ "$tag" = hpctrain-probe ] && [ -n "$n" ] || continue
    any=1
    if [ "$r" = started ]; then started[$n]=1; else verdict[$n]="$r $why"; fi
  done <<< "$out"
  for n in "$@"; do
    case "$out" in *"srun: error: "*"node $n:"*|*"srun: error: $n: "*) named=1 ;; esac
  done
  for n in "$@"; do
    why=""
    if [ -n "${verdict[$n]+x}" ]; then
      r=${verdict[$n]%% *} why=${verdict[$n]#* }
      case "$r" in
        0) continue ;;
        3) printf '%s\t%s\n' "$n" "fs: $why"; continue ;;
        *) why="probe step failed (exit $r): $why" ;;
      esac
    else
      err=$(printf '%s\n' "$out" | grep -F -e "node $n:" -e "srun: error: $n: " | grep '^srun: error: ' | tail -n 1 |
        tr -d '\000-\037' | cut -c1-200) || true
      if [ -n "$err" ]; then why="probe step failed (exit $rc): $err"
      elif [ "$rc" = 124 ] && [ -n "${started[$n]+x}" ]; then
        why="the probe step started and did not end in $hpctrain_probe_start_s s"
      elif [ "$rc" = 124 ]; then why="the probe step did not start in $hpctrain_probe_start_s s (HPCTRAIN_PROBE_START_S)"
      elif [ "$rc" = 0 ] || [ -n "$any$named" ]; then continue  # no fault of its own seen
      else
        why="probe step failed (exit $rc): $(printf '%s\n' "$out" | grep '^srun: error: ' | tail -n 1 |
          tr -d '\000-\037' | cut -c1-200)"
      fi
    fi
    printf '%s\t%s%s\n' "$n" "$why" "${hpctrain_suspect[$n]:+; also: ${hpctrain_suspect[$n]}}"
  done
}
hpctrain_faults() {  # 'node<TAB>why' for every node named faulty after the step
  local n why how now st
  if [ -s "$HPCTRAIN_BAD_NODES_FILE" ]; then
    while IFS=$'\t' read -r n why how; do
      if [ "$how" = suspect ]; then hpctrain_suspect[$n]=$why; continue; fi  # the probe decides
      printf '%s\t%s\n' "$n" "${why:-named by a task}"
    done < "$HPCTRAIN_BAD_NODES_FILE"
  fi
  # Slurm's view, after a failed step only (a clean stop names no node): a node that left the job, or
  # one Slurm shows DOWN or FAIL. Not DRAIN (maintenance, a reboot ASAP: the node is healthy) and not
  # NOT_RESPONDING alone (one missed RPC from a busy or restarting slurmd): the probe below decides.
  [ "$hpctrain_rc" != 0 ] || return 0
  now=" $(hpctrain_hosts "$(hpctrain_job_field NodeList)" | tr "\n" " ")"
  for n in $hpctrain_step_hosts; do
    case "$now" in *" $n "*) ;; *) printf '%s\t%s\n' "$n" "left the job's allocation (Slurm: node failure)" ;; esac
  done
  while IFS=$'\t' read -r n st; do
    case "$hpctrain_step_hosts" in *" $n "*) ;; *) continue ;; esac
    case "${st%%+*}:+$st+" in DOWN:*|*+FAIL+*) printf '%s\t%s\n' "$n" "node state $st (scontrol show node)" ;; esac
  done < <(hpctrain_node_states "$(hpctrain_commas "$now")")
  # shellcheck disable=SC2086  # node names (hpctrain_names), one word each
  hpctrain_probe $now  # one step over them all
}
hpctrain_name_faults() {  # hpctrain_new (node names) and hpctrain_fault (why), for this job's nodes only
  local n why st faults seen=' '
  hpctrain_new="" hpctrain_fault=""
  # a job Slurm is ending or requeueing itself (NODE_FAIL without --no-kill, scancel): its own
  # decision; probes would fail on healthy nodes then
  hpctrain_field st JobState
  [ "$st" = RUNNING ] || return 0
  hpctrain_out faults hpctrain_faults  # probe steps: a trapped signal acts at once (signals.sh)
  hpctrain_fs=""
  while IFS=$'\t' read -r n why; do
    case "$why" in "fs: "*) hpctrain_fs="${hpctrain_fs:+$hpctrain_fs, }$n"; continue ;; esac
    case "$hpctrain_alloc" in *" $n "*) ;; *) continue ;; esac
    [ -n "$(printf '%s\n' "$n" | hpctrain_names)" ] || continue
    case "$seen$hpctrain_bad" in *" $n "*) continue ;; esac  # once each; none left out before
    seen="$seen$n " hpctrain_new="$hpctrain_new$n "
    hpctrain_fault="${hpctrain_fault:+$hpctrain_fault; }$n: $(printf '%s' "$why" | tr -d '\000-\037')"
  done <<< "$faults"
  if [ -n "$hpctrain_fs" ]; then  # a stall of the shared file system is no node's fault: none left out
    echo "hpctrain: the run directory took no write in 5 s from $hpctrain_fs: a file-system stall," \
      "not a node fault; no node is left out for it" >&2
    local named=$hpctrain_new fault=$hpctrain_fault
    hpctrain_new="" hpctrain_fault="file-system stall (no write in 5 s from $hpctrain_fs)"
    hpctrain_record fs_stall
    hpctrain_new=$named hpctrain_fault=$fault
  fi
}
hpctrain_record() {  # a line of $HPCTRAIN_FAULTS_FILE: time, restart, attempt, action, nodes, why, step end
  local now
  hpctrain_now now  # with microseconds, as the step's end: the restart's phases are split to the second and below
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$now" "${SLURM_RESTART_COUNT:-0}" "$hpctrain_attempt" "$1" \
    "$(hpctrain_commas "$hpctrain_new")" "$hpctrain_fault" "$hpctrain_ended" >> "$HPCTRAIN_FAULTS_FILE" || true
}
# hpctrain_setup_spares: the nodes to train on, the files, the probe's settings
hpctrain_setup_spares() {
  local v
  hpctrain_min_nodes=${hpctrain_min_nodes:-0}  # a script rendered before node ranges sets none
  for v in "$hpctrain_spares" "$hpctrain_min_nodes" "$hpctrain_tpn" "${SLURM_JOB_NUM_NODES:-1}"; do  # before arithmetic
    case "$v" in
      ''|*[!0-9]*) echo "hpctrain: HPCTRAIN_SPARE_NODES ($hpctrain_spares), HPCTRAIN_MIN_NODES ($hpctrain_min_nodes),\
 SLURM_NTASKS_PER_NODE ($hpctrain_tpn) and SLURM_JOB_NUM_NODES (${SLURM_JOB_NUM_NODES:-}) must be whole numbers" >&2
        exit 1 ;;
    esac
  done
  # the allocation is --no-kill (spares, a node range): a lost node leaves it, the steps name their nodes
  hpctrain_no_kill=0
  if [ "$hpctrain_spares" -gt 0 ] || [ "$hpctrain_min_nodes" -gt 0 ]; then hpctrain_no_kill=1; fi
  hpctrain_train_nodes=$(( ${SLURM_JOB_NUM_NODES:-1} - hpctrain_spares ))
  if [ "$hpctrain_train_nodes" -lt 1 ]; then
    echo "hpctrain: $hpctrain_spares spare node(s) leave none of the job's ${SLURM_JOB_NUM_NODES:-1} to train on:" \
      "ask for more nodes or fewer spares (HPCTRAIN_SPARE_NODES)" >&2
    exit 1
  fi
  export HPCTRAIN_BAD_NODES_FILE="$HPCTRAIN_CONTROL_DIR/bad-nodes-${SLURM_JOB_ID:-none}"
  # one line per in-job restart or exclusion, kept across requeues: rank 0 records them (metrics.jsonl)
  export HPCTRAIN_FAULTS_FILE="$HPCTRAIN_CONTROL_DIR/faults-${SLURM_JOB_ID:-none}"
  hpctrain_alloc=" $(hpctrain_hosts "${SLURM_JOB_NODELIST:-}" | tr "\n" " ")"
  hpctrain_bad=" " hpctrain_bad_why="" hpctrain_attempt=0 hpctrain_step=()  # the nodes left out, and why
  hpctrain_gpus=${HPCTRAIN_PROBE_GPUS-${SLURM_GPUS_PER_NODE##*:}}
  hpctrain_probe_gpus=()
  if [ -n "${SLURM_GPUS_PER_NODE:-}" ]; then hpctrain_probe_gpus=(--gpus-per-node="$SLURM_GPUS_PER_NODE"); fi
  # seconds: each check on the node; a probe step to start and end (a Prolog inside it included)
  hpctrain_probe_s=${HPCTRAIN_PROBE_S:-10} hpctrain_probe_start_s=${HPCTRAIN_PROBE_START_S:-120}
  for v in "$hpctrain_probe_s" "$hpctrain_probe_start_s"; do
    case "$v" in
      ''|*[!0-9]*|0) echo "hpctrain: HPCTRAIN_PROBE_S ($hpctrain_probe_s) and HPCTRAIN_PROBE_START_S" \
        "($hpctrain_probe_start_s) must be whole numbers of seconds above 0" >&2; exit 1 ;;
    esac
  done
  declare -gA hpctrain_suspect=()  # node → why a task suspected it: excluded only if its probe fails
}
