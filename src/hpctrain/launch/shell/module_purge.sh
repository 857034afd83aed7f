# shellcheck shell=bash
# summary: module purge, as the profile asks (module_purge: it can remove apptainer or slurm)
if [ -n "$hpctrain_modules" ] && { [ -n "$hpctrain_modules_host" ] || type module >/dev/null 2>&1; }; then
  module purge
fi
