# shellcheck shell=bash
# summary: container.stage_image: one step of one task per node copies the image before training
# Image staging (container.stage_image): one task per node copies the SIF to node-local disk
# (skipped where an up-to-date copy is), and each task starts from its node's copy: the shared
# file system sees one read per node, not one per task (launch/stage_image.py). Each node reports
# "ok", "skip <why>" (its user directory is another user's or unsafe: its tasks read the shared image)
# or why not. In a --no-kill allocation a node whose copy failed is left out like a faulty node
# (spares.sh's hpctrain_bad): with spares, while enough nodes are left to train on; in a node range, the
# job trains on the nodes left, at least its MIN, at the same global batch (as after a lost node).
export HPCTRAIN_STAGE_REPORT="$HPCTRAIN_CONTROL_DIR/staged-${SLURM_JOB_ID:-none}"
rm -rf "$HPCTRAIN_STAGE_REPORT" && mkdir -p "$HPCTRAIN_STAGE_REPORT"
hpctrain_stage_kill=1
if [ "$hpctrain_no_kill" = 1 ]; then hpctrain_stage_kill=0; fi  # spares or a range: the other nodes finish their copies
hpctrain_rc=0
hpctrain_fg hpctrain_slurm -1 srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
  --kill-on-bad-exit="$hpctrain_stage_kill" bash -c "$hpctrain_stage_image" hpctrain-stage-image || hpctrain_rc=$?
hpctrain_stage_bad="" hpctrain_stage_why="" HPCTRAIN_STAGE_SKIP=""
for hpctrain_n in $hpctrain_alloc; do
  hpctrain_v=$(head -c 300 "$HPCTRAIN_STAGE_REPORT/$hpctrain_n" 2>/dev/null | head -n 1 | tr -d '\000-\037') || true
  [ "$hpctrain_v" != ok ] || continue
  # skipped (its copier said why in one line): that node's tasks read the shared image, silently
  case $hpctrain_v in "skip "*) HPCTRAIN_STAGE_SKIP="$HPCTRAIN_STAGE_SKIP$hpctrain_n "; continue ;; esac
  hpctrain_stage_bad="$hpctrain_stage_bad$hpctrain_n "
  hpctrain_v=${hpctrain_v:-no report from its copy step}
  hpctrain_stage_why="${hpctrain_stage_why:+$hpctrain_stage_why; }$hpctrain_n: image staging failed ($hpctrain_v)"
done
rm -rf "$HPCTRAIN_STAGE_REPORT"
export HPCTRAIN_STAGE_SKIP  # image_swap.sh: the nodes whose tasks read $HPCTRAIN_IMAGE itself
if [ "$hpctrain_rc" != 0 ] || { [ "$hpctrain_no_kill" = 1 ] && [ -n "$hpctrain_stage_bad" ]; }; then
  hpctrain_left=$(( $(echo $hpctrain_alloc | wc -w) - $(echo $hpctrain_stage_bad | wc -w) ))
  hpctrain_on=""  # what the job trains on without the failed copies; empty: it cannot go on
  if [ "$hpctrain_no_kill" = 1 ] && [ -n "$hpctrain_stage_bad" ]; then
    if [ "$hpctrain_left" -ge "$hpctrain_train_nodes" ]; then
      hpctrain_on="training on $hpctrain_train_nodes of the $hpctrain_left node(s) whose copy is ready"
    elif [ "$hpctrain_min_nodes" -gt 0 ] && [ "$hpctrain_left" -ge "$hpctrain_min_nodes" ]; then
      hpctrain_on="training on the $hpctrain_left node(s) whose copy is ready instead of $hpctrain_train_nodes"
      hpctrain_on="$hpctrain_on (node range, at least $hpctrain_min_nodes), at the same global batch"
      hpctrain_train_nodes=$hpctrain_left
    fi
  fi
  if [ -n "$hpctrain_on" ]; then
    hpctrain_bad="$hpctrain_bad$hpctrain_stage_bad"
    hpctrain_bad_why="${hpctrain_bad_why:+$hpctrain_bad_why; }$hpctrain_stage_why"
    hpctrain_exclude_add "$hpctrain_stage_bad" "$hpctrain_stage_why"  # exclude.sh: at a requeue too
    echo "hpctrain: $hpctrain_stage_why: left out; $hpctrain_on" >&2
  else
    # each node's reason from its report: srun may drop the stderr of a step it kills (--kill-on-bad-exit:
    # measured, the failing copier's own line was lost on an idle machine and kept under load)
    echo "hpctrain: staging $HPCTRAIN_IMAGE to node-local disk failed: ${hpctrain_stage_why:-srun exit $hpctrain_rc};" \
      "set container.stage_image false to read it in place" >&2
    exit 1
  fi
fi
