# shellcheck shell=bash
# summary: module use the profile's module_use paths (for the runtime's modules: where `module` exists)
# shellcheck disable=SC2154  # hpctrain_modules*: job_modules.sh or modules_of.sh; hpctrain_module_use: the header's
if [ -n "$hpctrain_modules" ] && { [ -n "$hpctrain_modules_host" ] || type module >/dev/null 2>&1; }; then
  for hpctrain_module_dir in "${hpctrain_module_use[@]}"; do module use "$hpctrain_module_dir"; done
fi
