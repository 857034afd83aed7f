"""The batch shell's loop over srun steps: hot spare nodes and bad-node exclusion (issue 22).

With `slurm.spare_nodes` K (`--spare-nodes`) the job holds N+K nodes with `--no-kill` and trains
on N of them. When a step fails, the shell names the faulty nodes — the tasks' own reports
(`$HPCTRAIN_BAD_NODES_FILE`, hpctrain.badnodes), Slurm's view (a failed node leaves a `--no-kill`
job's NodeList; `scontrol show node` says DOWN/NOT_RESPONDING/DRAIN), a short probe step per node
of the allocation — and starts the next step on N healthy nodes without them: the ranks resume
from the last checkpoint (`--resume auto`), with no requeue and no queue wait. A step that failed
naming no node ends the job as before (never a retry loop). Fewer than N healthy nodes left, or no
spares: the job is requeued and the named nodes go into its ExcNodeList at once (Slurm takes
ExcNodeList only while the job is pending; a requeued job waits cred_expire). Every restart and
exclusion is a line of `$HPCTRAIN_FAULTS_FILE` that rank 0 turns into a metrics record
(hpctrain.faultlog). Facts and sources: docs/spares.md.
"""

from __future__ import annotations

from hpctrain.badnodes import NODE_NAME

# badnodes.NODE_NAME for `grep -xE`: the shell passes on no other node name
NODE_ERE = NODE_NAME.pattern


def setup_lines(spares: int, tasks_per_node: int) -> list[str]:
    """Before the first step: how many nodes train, the files, and the shell functions."""
    return [
        "# Hot spares (slurm.spare_nodes; HPCTRAIN_SPARE_NODES overrides): the job holds that many nodes more",
        "# than it trains on (#SBATCH --no-kill: a failed node leaves the job instead of ending it). After a",
        "# failed step this shell names the faulty nodes (the tasks' $HPCTRAIN_BAD_NODES_FILE, Slurm's node",
        "# states, a probe step per node) and starts the next step on healthy nodes of the same allocation;",
        "# without enough of them it requeues the job with those nodes in its ExcNodeList (docs/spares.md).",
        f"hpctrain_spares=${{HPCTRAIN_SPARE_NODES-{int(spares)}}}",
        f"hpctrain_tpn=${{SLURM_NTASKS_PER_NODE:-{int(tasks_per_node)}}}",
        'for hpctrain_v in "$hpctrain_spares" "$hpctrain_tpn" "${SLURM_JOB_NUM_NODES:-1}"; do  # before arithmetic',
        '  case "$hpctrain_v" in',
        "    ''|*[!0-9]*) echo \"hpctrain: HPCTRAIN_SPARE_NODES ($hpctrain_spares), SLURM_NTASKS_PER_NODE\\",
        ' ($hpctrain_tpn) and SLURM_JOB_NUM_NODES (${SLURM_JOB_NUM_NODES:-}) must be whole numbers" >&2; exit 1 ;;',
        "  esac",
        "done",
        'hpctrain_train_nodes=$(( ${SLURM_JOB_NUM_NODES:-1} - hpctrain_spares ))',
        'if [ "$hpctrain_train_nodes" -lt 1 ]; then',
        '  echo "hpctrain: $hpctrain_spares spare node(s) leave none of the job\'s ${SLURM_JOB_NUM_NODES:-1} to train '
        'on: ask for more nodes or fewer spares (HPCTRAIN_SPARE_NODES)" >&2',
        "  exit 1",
        "fi",
        'export HPCTRAIN_BAD_NODES_FILE="$HPCTRAIN_CONTROL_DIR/bad-nodes-${SLURM_JOB_ID:-none}"',
        "# one line per in-job restart or exclusion, kept across requeues: rank 0 records them (metrics.jsonl)",
        'export HPCTRAIN_FAULTS_FILE="$HPCTRAIN_CONTROL_DIR/faults-${SLURM_JOB_ID:-none}"',
        "hpctrain_names() {  # only names a node may have (hpctrain.badnodes.NODE_NAME), one per line",
        f"  grep -xE '{NODE_ERE}' || true",
        "}",
        "hpctrain_hosts() {  # a Slurm host list → node names, one per line",
        '  { scontrol show hostnames "$1" 2>/dev/null || true; } | hpctrain_names  # (set -o pipefail)',
        "}",
        'hpctrain_alloc=" $(hpctrain_hosts "${SLURM_JOB_NODELIST:-}" | tr "\\n" " ")"',
        'hpctrain_bad=" " hpctrain_attempt=0 hpctrain_step=()',
        "hpctrain_healthy() {  # the job's nodes now (a failed node leaves a --no-kill job), minus the excluded",
        "  local n",
        '  for n in $(hpctrain_hosts "$(hpctrain_job_field NodeList)"); do',
        '    case "$hpctrain_bad" in *" $n "*) ;; *) echo "$n" ;; esac',
        "  done",
        "}",
        "hpctrain_probe() {  # a short step on one node: does it still run a task?",
        '  timeout "${HPCTRAIN_PROBE_S:-10}" srun --overlap --nodes=1 --ntasks=1 --nodelist="$1" true '
        ">/dev/null 2>&1 ||",
        "    printf '%s\\t%s\\n' \"$1\" \"no answer to a probe step (srun true, ${HPCTRAIN_PROBE_S:-10} s)\"",
        "}",
        "hpctrain_faults() {  # 'node<TAB>why' for every node named faulty after the step",
        "  local n why now st",
        '  if [ -s "$HPCTRAIN_BAD_NODES_FILE" ]; then',
        "    while IFS=$'\\t' read -r n why; do printf '%s\\t%s\\n' \"$n\" \"${why:-named by a task}\"; done "
        '< "$HPCTRAIN_BAD_NODES_FILE"',
        "  fi",
        '  now=" $(hpctrain_hosts "$(hpctrain_job_field NodeList)" | tr "\\n" " ")"',
        "  for n in $hpctrain_step_hosts; do",
        '    case "$now" in *" $n "*) ;; *) printf \'%s\\t%s\\n\' "$n" "left the job\'s allocation (Slurm: node '
        'failure)"; continue ;; esac',
        '    st=$(scontrol show node -o "$n" 2>/dev/null | tr " " "\\n" | sed -n "s/^State=//p")',
        '    case "$st" in *DOWN*|*NOT_RESPONDING*|*DRAIN*|*FAIL*) printf \'%s\\t%s\\n\' "$n" "node state $st '
        '(scontrol show node)" ;; esac',
        "  done",
        '  if [ "$hpctrain_rc" != 0 ]; then',
        '    for n in $now; do hpctrain_probe "$n" & done',
        "    wait",
        "  fi",
        "}",
        "hpctrain_name_faults() {  # hpctrain_new (node names) and hpctrain_fault (why), for this job's nodes only",
        "  local n why seen=' '",
        '  hpctrain_new="" hpctrain_fault=""',
        "  # a job Slurm is ending or requeueing itself (NODE_FAIL without --no-kill, scancel): its own",
        "  # decision; probes would fail on healthy nodes then",
        '  [ "$(hpctrain_job_field JobState)" = RUNNING ] || return 0',
        "  while IFS=$'\\t' read -r n why; do",
        '    case "$hpctrain_alloc" in *" $n "*) ;; *) continue ;; esac',
        '    [ -n "$(printf \'%s\\n\' "$n" | hpctrain_names)" ] || continue',
        '    case "$seen" in *" $n "*) continue ;; esac',
        '    seen="$seen$n " hpctrain_new="$hpctrain_new$n "',
        '    hpctrain_fault="${hpctrain_fault:+$hpctrain_fault; }$n: $(printf \'%s\' "$why" | tr -d \'\\000-\\037\')"',
        "  done <<< \"$(hpctrain_faults)\"",
        "}",
        "hpctrain_record() {  # a line of $HPCTRAIN_FAULTS_FILE: time, restart, attempt, action, nodes, why, step end",
        "  printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' \"$(date +%s)\" \"${SLURM_RESTART_COUNT:-0}\" "
        '"$hpctrain_attempt" "$1" "$(echo $hpctrain_new | tr " " ",")" "$hpctrain_fault" "$hpctrain_ended" \\',
        '    >> "$HPCTRAIN_FAULTS_FILE" || true',
        "}",
        "# Requeue with the named nodes added to ExcNodeList, which Slurm takes on pending jobs only: right",
        "# after the requeue (a requeued job may start only after cred_expire, 120 s by default; not held,",
        "# which would leave the job held if this shell died before the release).",
        "hpctrain_requeue_excluding() {",
        "  local old new",
        '  old=$(hpctrain_job_field ExcNodeList); [ "$old" != "(null)" ] || old=""',
        '  new=$(echo $old $hpctrain_bad | tr " " ",")',
        '  scontrol requeue "$hpctrain_job" || return 1',
        '  if scontrol update job="$hpctrain_job" ExcNodeList="$new"; then',
        '    hpctrain_new=$hpctrain_bad; hpctrain_record requeue',
        '    echo "hpctrain: job $hpctrain_job requeued without $new"',
        '  else echo "hpctrain: job $hpctrain_job requeued; $new could not be excluded: it may run there again" >&2',
        "  fi",
        "}",
    ]


def guard_lines() -> list[str]:
    """Spare mode: a step on another node that requeues the job when the batch host dies. Measured
    (22.05): a --no-kill job whose batch host dies stays RUNNING on its other nodes without a batch
    script, also after the node is back, until its time limit; a guard step there sees the node
    DOWN/NOT_RESPONDING (~14 s with SlurmdTimeout 10) and requeues it (docs/spares.md)."""
    return [
        'hpctrain_batch_host=$(printf "%s\n" "${SLURMD_NODENAME:-}" | hpctrain_names)',
        'hpctrain_guard_node=$(for n in $hpctrain_alloc; do [ "$n" = "$hpctrain_batch_host" ] || echo "$n"; done '
        '| tail -n 1)',
        'if [ "$hpctrain_spares" -gt 0 ] && [ -n "$hpctrain_batch_host" ] && [ -n "$hpctrain_guard_node" ]; then',
        '  srun --overlap --nodes=1 --ntasks=1 --nodelist="$hpctrain_guard_node" bash -c \'',
        '    while sleep "${HPCTRAIN_GUARD_S:-10}"; do',
        '      st=$(scontrol show node -o "$1" 2>/dev/null | tr " " "\\n" | sed -n "s/^State=//p")',
        '      case "$st" in *DOWN*|*NOT_RESPONDING*|*FAIL*) ;; *) continue ;; esac',
        '      echo "hpctrain: the batch host $1 is $st: its shell is gone; requeueing job $2 without it" >&2',
        '      old=$(scontrol show job -o "$2" | tr " " "\\n" | sed -n "s/^ExcNodeList=//p")',
        '      [ "$old" != "(null)" ] || old=""',
        '      trap "" TERM  # the requeue TERMs this step too: finish the update first (KillWait)',
        '      scontrol requeue "$2" || { scancel "$2"; exit 1; }',
        '      scontrol update job="$2" ExcNodeList="${old:+$old,}$1"; exit 0',
        '    done\' hpctrain-guard "$hpctrain_batch_host" "$hpctrain_job" &',
        "fi",
    ]


def step_lines() -> list[str]:
    """At the top of each pass of the step loop: the step's nodes (spare mode) and a clean slate."""
    return [
        'hpctrain_step_hosts=$hpctrain_alloc',
        'if [ "$hpctrain_spares" -gt 0 ]; then',
        '  hpctrain_step_hosts=" $(hpctrain_healthy | head -n "$hpctrain_train_nodes" | tr "\\n" " ")"',
        "  # --overlap: a failed step stays RUNNING in slurmctld while its lost node cannot confirm its end,",
        "  # holding its CPUs and GPUs on the healthy nodes too (measured); its tasks are gone, so share them",
        '  hpctrain_step=(--nodes="$hpctrain_train_nodes" --ntasks=$((hpctrain_train_nodes * hpctrain_tpn))',
        '                 --nodelist="$(echo $hpctrain_step_hosts | tr " " ",")" --overlap --open-mode=append)',
        "fi",
        "export HPCTRAIN_ATTEMPT=$hpctrain_attempt",
        'rm -f "$HPCTRAIN_STOP_FILE" "$HPCTRAIN_BAD_NODES_FILE"',
    ]


def after_step_lines() -> list[str]:
    """After a step's decision is read: restart in place on named nodes, or leave the loop."""
    return [
        'hpctrain_ended=$(date +%s) hpctrain_new=""',
        "# a failed step (or a stop the tasks asked to requeue): did it name nodes? None named: as before",
        'if [ "$hpctrain_decision" != end ] &&',
        '   { [ "$hpctrain_rc" != 0 ] || [ "$hpctrain_decision" = requeue ]; }; then',
        "  hpctrain_name_faults",
        "fi",
        '[ -n "$hpctrain_new" ] || break',
        'hpctrain_bad="$hpctrain_bad$hpctrain_new"',
        'hpctrain_left=$(hpctrain_healthy | wc -l)',
        'if [ "$hpctrain_spares" -gt 0 ] && [ "$hpctrain_left" -ge "$hpctrain_train_nodes" ] && '
        '[ -z "$hpctrain_signal" ] && ! hpctrain_preempted; then',
        "  hpctrain_attempt=$((hpctrain_attempt + 1))",
        "  hpctrain_record restart",
        '  echo "hpctrain: step failed (exit $hpctrain_rc) at $(date +%T); faulty: $hpctrain_fault. Restart '
        '$hpctrain_attempt in this job on $hpctrain_train_nodes of $hpctrain_left healthy nodes, from the last '
        'checkpoint" >&2',
        "  continue",
        "fi",
        'echo "hpctrain: faulty: $hpctrain_fault; $hpctrain_left healthy node(s) left of the $hpctrain_train_nodes '
        'needed: requeueing without them" >&2',
        'if [ "$hpctrain_decision" != requeue ]; then',
        "  hpctrain_decision=requeue",
        '  hpctrain_why="the step failed (exit $hpctrain_rc) on faulty node(s): $hpctrain_fault"',
        "fi",
        "break",
    ]
