# shellcheck shell=bash
# summary: module load the host Python's modules; a module that fails to load stops the job
if [ -n "$hpctrain_modules" ] && [ -n "$hpctrain_modules_host" ]; then
  # shellcheck disable=SC2086  # word-split on purpose: one name per word
  module load $hpctrain_modules
fi
