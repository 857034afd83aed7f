# shellcheck shell=bash
# summary: module use the profile's module_use paths (for the runtime's modules: where `module` exists)
if [ -n "$hpctrain_modules" ] && { [ -n "$hpctrain_modules_host" ] || type module >/dev/null 2>&1; }; then
  for hpctrain_module_dir in "${hpctrain_module_use[@]}"; do module use "$hpctrain_module_dir"; done
fi
