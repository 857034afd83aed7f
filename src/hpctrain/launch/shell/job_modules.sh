# shellcheck shell=bash
# summary: the modules to load: HPCTRAIN_MODULES for the host's Python, else HPCTRAIN_CONTAINER_MODULES
# hpctrain_modules_host: set when the tasks run on the host's Python (a failed load stops the job:
# module_load.sh); else the runtime's modules, which may be missing (container_modules.sh).
if [ "$CONTAINER" = none ]; then
  hpctrain_modules=$HPCTRAIN_MODULES hpctrain_modules_host=1
else
  hpctrain_modules=$HPCTRAIN_CONTAINER_MODULES hpctrain_modules_host=""
fi
