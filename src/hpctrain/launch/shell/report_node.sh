# shellcheck shell=bash
# summary: tell the site of a node this job leaves out (slurm.report_bad_node)
# Tell the site's admins of a node this job leaves out (slurm.report_bad_node, docs/sites.md): the
# site's command gets node, evidence and job id as three arguments (never read by a shell), and/or the
# file gets one line: time (UTC), job id, node, user, evidence, tab-separated. Each is bounded by
# $hpctrain_report_s (a hung command or a stalled file system) and runs through hpctrain_fg (a trapped
# signal acts at once); a failure is one warning line, never the job's end. Call as `|| true`.
hpctrain_report_node() {  # $1 node, $2 evidence
  local ev rc
  ev=$(printf '%s' "$2" | tr -d '\000-\037' | cut -c1-1000)
  if [ "${#hpctrain_report_cmd[@]}" -gt 0 ]; then
    hpctrain_fg timeout -k 5 "$hpctrain_report_s" "${hpctrain_report_cmd[@]}" "$1" "$ev" "$hpctrain_job" \
      </dev/null >&2; rc=$?
    [ "$rc" = 0 ] || echo "hpctrain: warning: slurm.report_bad_node.command failed for node $1 (exit $rc$(
      [ "$rc" != 124 ] || echo ": no end in $hpctrain_report_s s")): the node is left out all the same" >&2
  fi
  if [ -n "$hpctrain_report_file" ]; then
    hpctrain_fg timeout -k 5 "$hpctrain_report_s" bash -c 'printf "%s\n" "$2" >> "$1"' hpctrain-report \
      "$hpctrain_report_file" "$(date -u +%FT%TZ)"$'\t'"$hpctrain_job"$'\t'"$1"$'\t'"$(id -un)"$'\t'"$ev"; rc=$?
    [ "$rc" = 0 ] || echo "hpctrain: warning: could not append node $1 to slurm.report_bad_node.file" \
      "$hpctrain_report_file (exit $rc): the node is left out all the same" >&2
  fi
  return 0
}
