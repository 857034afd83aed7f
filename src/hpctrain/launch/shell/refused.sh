# shellcheck shell=bash
# summary: a runtime that cannot run this job as written: say why (hpctrain_refused) and stop
echo "hpctrain: ${hpctrain_refused:?}" >&2
exit 1
