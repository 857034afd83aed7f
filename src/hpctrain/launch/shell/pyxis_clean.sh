# shellcheck shell=bash
# summary: container.stage_image under pyxis: remove the containers this job named on its nodes
# container.stage_image under pyxis: remove what this job named. pyxis removes a named container only
# under container_scope=job (its job epilog); under the default, global, each attempt's unpacked image
# would stay on its nodes (docs/runtimes.md). One step of one task per node runs pyxis_remove.sh there:
# at the start of a requeued attempt (the earlier attempts' containers on this attempt's nodes), and as
# this shell ends, on every path (the EXIT trap; before `scontrol requeue` in requeue.sh, which ends the
# steps). A removal that fails or takes over HPCTRAIN_PYXIS_CLEAN_S is one warning, never the job's end.
hpctrain_pyxis_cleaned=""
hpctrain_pyxis_clean() {  # $1: the container to keep ('' removes all of the job's); call as `|| true`
  local nodes n err rc job=${hpctrain_pyxis_job-}  # pyxis_name.sh
  [ -z "$hpctrain_pyxis_cleaned" ] || return 0
  # a job Slurm requeued or is ending runs no new step: its next attempt removes them at its start
  [ "$(hpctrain_job_field JobState)" = RUNNING ] || return 0
  nodes=" $(hpctrain_healthy | tr "\n" " ")"
  n=$(echo $nodes | wc -w)
  [ "$n" -gt 0 ] || return 0
  [ -n "$1" ] || hpctrain_pyxis_cleaned=1
  { err=$(hpctrain_slurm -1 -t "${HPCTRAIN_PYXIS_CLEAN_S:-60}" srun --overlap --nodes="$n" --ntasks="$n" --ntasks-per-node=1 \
      --nodelist="$(hpctrain_commas "$nodes")" --kill-on-bad-exit=0 \
      bash -c "$hpctrain_pyxis_remove" hpctrain-pyxis-clean "$job" "$1" 2>&1 1>&3); } 3>&1
  rc=$?
  [ "$rc" != 0 ] || return 0
  [ "$rc" != 124 ] || err="no answer in ${HPCTRAIN_PYXIS_CLEAN_S:-60} s"
  echo "hpctrain: warning: removing job $job's pyxis containers failed (exit $rc:" \
    "$(printf '%s' "$err" | tr '\n' ' ' | tr -d '\000-\037' | cut -c1-300)); what is left stays on the node" \
    "until removed there ('enroot list' names them: pyxis_hpctrain-$job-*; 'enroot remove -f NAME')" >&2
}
hpctrain_pyxis_clean_all() { hpctrain_pyxis_clean ""; }
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then hpctrain_pyxis_clean "${hpctrain_pyxis_name-}" || true; fi
hpctrain_at_exit+=(hpctrain_pyxis_clean_all)
